//! The Vast.ai client against the Vast.ai simulator: offer search under a policy, create, get,
//! paged lists by label, destroy, logs, pacing under per-route limits, and money safety: an
//! unclear create never makes a second instance, a vanished offer moves on to the next.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use runpod_contract::{PortProtocol, PortSpec};
use runpod_kubelet::vastai::client::{
    Destroyed, LogPolls, RetryPolicy, VastClient, VastConfig, VastKey,
};
use runpod_kubelet::vastai::error::VastError;
use runpod_kubelet::vastai::label::Label;
use runpod_kubelet::vastai::limiter::{Pace, Paces, Route as ClientRoute};
use runpod_kubelet::vastai::model::{CreateRequest, InstanceState, RegistryLogin};
use runpod_kubelet::vastai::placement::{Bought, BuyError};
use runpod_kubelet::vastai::select::OfferQuery;
use serde_json::json;
use vastai_simulator::{
    Behaviour, Effect, Fault, ImageRule, Match, RateLimits, Route, Scenario, SimulatorHandle,
    VastSimulator, duplicate_labels, live_instances,
};

const KEY: &str = "vast_TESTKEY0123456789abcdefSECRET";

fn fast_scenario() -> Scenario {
    Scenario {
        provisioning_ms: 20,
        loading_ms: 50,
        list_lag_ms: 300,
        log_ready_polls: 2,
        rate_limits: RateLimits::none(),
        ..Scenario::default()
    }
}

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        attempts: 6,
        base_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(200),
        // 5 × 100 ms: longer than the simulator's 300 ms list lag.
        lookup_attempts: 6,
        lookup_interval: Duration::from_millis(100),
    }
}

fn config(sim: &SimulatorHandle) -> VastConfig {
    VastConfig {
        api_url: sim.base_url(),
        request_timeout: Duration::from_secs(5),
        paces: Paces::none(),
        retry: fast_retries(),
        log_polls: LogPolls {
            count: 10,
            interval: Duration::from_millis(10),
        },
        ..VastConfig::default()
    }
}

async fn start(scenario: Scenario) -> (SimulatorHandle, VastClient) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sim = VastSimulator::start(scenario, Some(KEY.into()))
        .await
        .unwrap();
    let client = VastClient::new(config(&sim), VastKey::new(KEY.into()).unwrap()).unwrap();
    (sim, client)
}

fn label(uid: &str) -> Label {
    Label::new("prod-eu", "virtual-vastai", uid).unwrap()
}

fn request(label: &Label) -> CreateRequest {
    CreateRequest {
        image: "org/app:1".into(),
        disk_gb: 20,
        label: label.to_string(),
        env: BTreeMap::from([("TOKEN".to_owned(), "s3cr3t".to_owned())]),
        ports: vec![PortSpec {
            port: 8080,
            protocol: PortProtocol::Http,
        }],
        entrypoint: None,
        args: Some(vec!["serve".into(), "--port=8080".into()]),
        registry: Some(RegistryLogin::new("me", "tok3n", "ghcr.io").unwrap()),
        interruptible: None,
        price: None,
        price_cap: None,
    }
}

/// `count` copies of the scenario's first offer, ids 9000 on: one per create a test makes.
fn numbered_offers(count: u64) -> Vec<vastai_simulator::OfferSpec> {
    (0..count)
        .map(|i| {
            let mut offer = Scenario::default().offers[0].clone();
            offer.id = 9000 + i;
            offer
        })
        .collect()
}

fn rtx_4090() -> OfferQuery {
    OfferQuery {
        gpu_names: vec!["RTX 4090".into()],
        min_gpu_memory_gb: Some(24),
        disk_gb: 20,
        ..OfferQuery::default()
    }
}

#[tokio::test]
async fn search_applies_the_policy_and_rechecks_rows() {
    let (sim, client) = start(fast_scenario()).await;
    let all = client.search(&rtx_4090()).await.unwrap();
    let ids: Vec<u64> = all.iter().map(|o| o.id).collect();
    // Verified, 1 GPU, reliability ≥ 0.98, cheapest first; 1003 is unverified, 1004 has 2 GPUs.
    assert_eq!(ids, vec![1006, 1002, 1005, 1001]);
    assert!(all.windows(2).all(|w| w[0].dph_total <= w[1].dph_total));

    let strict = OfferQuery {
        countries: vec!["US".into(), "JP".into()],
        datacenter_only: true,
        min_reliability: 0.993,
        max_price_per_hour: Some(0.45),
        ..rtx_4090()
    };
    let ids: Vec<u64> = client
        .search(&strict)
        .await
        .unwrap()
        .iter()
        .map(|o| o.id)
        .collect();
    // 1006 ("California, United States") names no country: outside any country policy.
    assert_eq!(ids, vec![1001]);
    assert_eq!(sim.requests(Route::Search), 2);
    sim.shutdown().await;
}

#[tokio::test]
async fn create_track_and_destroy() {
    let (sim, client) = start(fast_scenario()).await;
    let pod = label("uid-create");
    let offers = client.search(&rtx_4090()).await.unwrap();
    let bought = client.buy(&pod, &offers, &request(&pod)).await.unwrap();
    let Bought::Created {
        instance_id,
        offer_id,
    } = bought
    else {
        panic!("expected a create, got {bought:?}");
    };
    assert_eq!(offer_id, offers[0].id);
    let entry = &sim.instances_labelled(&pod.to_string())[0];
    assert_eq!(entry.env["TOKEN"], "s3cr3t");
    assert_eq!(entry.ports, vec!["8080/tcp"]);
    assert_eq!(
        entry.args,
        Some(vec!["serve".to_owned(), "--port=8080".to_owned()])
    );
    assert_eq!(entry.runtype, "args");
    assert!(entry.image_login);
    assert_eq!(entry.disk, 20.0);

    let running = loop {
        let instance = client.get(instance_id).await.unwrap().unwrap();
        if instance.state() == InstanceState::Running {
            break instance;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(running.label.as_deref(), Some(pod.to_string().as_str()));
    let endpoint = &running.endpoints()["8080/tcp"];
    assert!(endpoint.starts_with("203.0.113.10:"), "{endpoint}");
    assert!(running.dph_total.unwrap() > 0.0);

    assert_eq!(
        client.destroy(instance_id).await.unwrap(),
        Destroyed::Destroyed
    );
    assert_eq!(
        client.destroy(instance_id).await.unwrap(),
        Destroyed::AlreadyGone
    );
    assert_eq!(client.get(instance_id).await.unwrap(), None);
    assert!(live_instances(&sim.ledger()).is_empty());
    sim.shutdown().await;
}

#[tokio::test]
async fn a_lost_create_answer_makes_exactly_one_instance() {
    let (sim, client) = start(fast_scenario()).await;
    let offers = client.search(&rtx_4090()).await.unwrap();

    // The instance is made, the answer is a 502, and the list lags 300 ms behind.
    sim.inject(
        Fault::new(
            Match::route(Route::Create),
            Effect::CreateThenFail { status: 502 },
        )
        .times(1),
    );
    let pod = label("uid-502");
    let bought = client.buy(&pod, &offers, &request(&pod)).await.unwrap();
    assert!(matches!(bought, Bought::Adopted { .. }), "{bought:?}");
    let made = sim.instances_labelled(&pod.to_string());
    assert_eq!(made.len(), 1, "one create, found by its label");
    assert_eq!(made[0].id, bought.instance_id());
    assert_eq!(made[0].create_status, 502);

    // The answer never comes (the client times out): same.
    let slow = VastClient::new(
        VastConfig {
            request_timeout: Duration::from_millis(200),
            ..config(&sim)
        },
        VastKey::new(KEY.into()).unwrap(),
    )
    .unwrap();
    sim.inject(
        Fault::new(
            Match::route(Route::Create),
            Effect::CreateThenStall { millis: 1_000 },
        )
        .times(1),
    );
    let pod = label("uid-timeout");
    let bought = slow.buy(&pod, &offers[1..], &request(&pod)).await.unwrap();
    assert!(matches!(bought, Bought::Adopted { .. }), "{bought:?}");
    assert_eq!(sim.instances_labelled(&pod.to_string()).len(), 1);

    // Buying again for a pod that has its instance buys nothing, although the list lags.
    let pod = label("uid-again");
    let first = client
        .buy(&pod, &offers[2..], &request(&pod))
        .await
        .unwrap();
    let second = client
        .buy(&pod, &offers[3..], &request(&pod))
        .await
        .unwrap();
    assert_eq!(
        second,
        Bought::Adopted {
            instance_id: first.instance_id()
        }
    );
    // So does a fresh client (a restarted controller) once the list shows it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let restarted = VastClient::new(config(&sim), VastKey::new(KEY.into()).unwrap()).unwrap();
    let third = restarted
        .buy(&pod, &offers[3..], &request(&pod))
        .await
        .unwrap();
    assert_eq!(
        third,
        Bought::Adopted {
            instance_id: first.instance_id()
        }
    );

    assert!(
        duplicate_labels(&sim.ledger()).is_empty(),
        "{:?}",
        sim.ledger()
    );
    assert_eq!(sim.ledger().len(), 3);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_vanished_offer_moves_on_and_unclear_lookups_stop_buying() {
    let (sim, client) = start(fast_scenario()).await;
    let offers = client.search(&rtx_4090()).await.unwrap();
    sim.inject(Fault::new(Match::route(Route::Create), Effect::NoSuchAsk).times(1));
    let pod = label("uid-race");
    let bought = client.buy(&pod, &offers, &request(&pod)).await.unwrap();
    assert_eq!(
        bought,
        Bought::Created {
            instance_id: bought.instance_id(),
            offer_id: offers[1].id
        },
        "the next offer"
    );

    // Every offer gone: nothing bought, and why.
    sim.inject(Fault::new(Match::route(Route::Create), Effect::NoSuchAsk));
    let pod = label("uid-none");
    let error = client
        .buy(&pod, &offers[2..], &request(&pod))
        .await
        .unwrap_err();
    let BuyError::NoOffer(attempts) = &error else {
        panic!("{error:?}");
    };
    assert_eq!(attempts.len(), offers.len() - 2);
    assert!(
        attempts
            .iter()
            .all(|a| matches!(a.error, VastError::NoSuchAsk { .. }))
    );
    sim.clear_faults();

    // The list failing before buying: nothing is even tried.
    sim.inject(Fault::new(
        Match::route(Route::List),
        Effect::Status {
            status: 503,
            error: None,
        },
    ));
    let pod = label("uid-blind");
    let error = client
        .buy(&pod, &offers[2..], &request(&pod))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            BuyError::Lookup(VastError::Server { status: 503, .. })
        ),
        "{error:?}"
    );
    assert!(sim.instances_labelled(&pod.to_string()).is_empty());
    sim.clear_faults();

    // A 502 on the create, then the list failing: the instance may exist, so nothing more is
    // bought on the other offers.
    for id in [8001, 8002, 8003] {
        let mut offer = Scenario::default().offers[0].clone();
        offer.id = id;
        sim.add_offer(offer);
    }
    let offers = client.search(&rtx_4090()).await.unwrap();
    assert_eq!(offers.len(), 3);
    sim.inject(
        Fault::new(
            Match::route(Route::Create),
            Effect::CreateThenFail { status: 502 },
        )
        .times(1),
    );
    sim.inject(
        Fault::new(
            Match::route(Route::List),
            Effect::Status {
                status: 503,
                error: None,
            },
        )
        .after(1),
    );
    let pod = label("uid-unconfirmed");
    let error = client.buy(&pod, &offers, &request(&pod)).await.unwrap_err();
    assert!(matches!(error, BuyError::Unconfirmed { .. }), "{error:?}");
    assert_eq!(sim.instances_labelled(&pod.to_string()).len(), 1);
    sim.clear_faults();
    // Once the list answers again, the next try adopts it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let bought = client
        .buy(&pod, &offers[1..], &request(&pod))
        .await
        .unwrap();
    assert!(matches!(bought, Bought::Adopted { .. }));
    assert_eq!(sim.instances_labelled(&pod.to_string()).len(), 1);
    assert!(duplicate_labels(&sim.ledger()).is_empty());
    sim.shutdown().await;
}

#[tokio::test]
async fn lists_page_through_many_instances_by_label() {
    let mut scenario = fast_scenario();
    scenario.list_lag_ms = 0;
    scenario.offers = numbered_offers(30);
    let (sim, client) = start(scenario).await;
    let offers = client
        .search(&OfferQuery {
            limit: 50,
            ..rtx_4090()
        })
        .await
        .unwrap();
    assert_eq!(offers.len(), 30);
    for (i, offer) in offers.iter().enumerate() {
        let pod = label(&format!("uid-{i}"));
        client
            .buy(&pod, std::slice::from_ref(offer), &request(&pod))
            .await
            .unwrap();
    }
    let all = client.list(&json!({})).await.unwrap();
    assert_eq!(all.len(), 30, "two pages of 25");
    let found = client.find_by_label(&label("uid-27")).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].label.as_deref(),
        Some("rpk:prod-eu:virtual-vastai:uid-27")
    );
    assert!(sim.requests(Route::List) >= 30 + 2);
    sim.shutdown().await;
}

#[tokio::test]
async fn logs_come_through_the_result_url() {
    let scenario = Scenario {
        images: vec![ImageRule {
            contains: "batch".into(),
            behaviour: Behaviour::Exit {
                after_ms: 20,
                code: 0,
            },
            logs: vec!["epoch 1".into(), "epoch 2".into(), "done".into()],
        }],
        ..fast_scenario()
    };
    let (sim, client) = start(scenario).await;
    let offers = client.search(&rtx_4090()).await.unwrap();
    let pod = label("uid-logs");
    let mut batch = request(&pod);
    batch.image = "org/batch:1".into();
    let id = client
        .buy(&pod, &offers, &batch)
        .await
        .unwrap()
        .instance_id();
    let exited = loop {
        let instance = client.get(id).await.unwrap().unwrap();
        if instance.is_dead() {
            break instance;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(exited.state(), InstanceState::Exited);
    assert_eq!(
        exited.status_msg.as_deref(),
        Some("Container exited with code 0")
    );
    // The file is missing for two polls, then there.
    assert_eq!(client.logs(id, 2).await.unwrap(), "epoch 2\ndone\n");
    assert_eq!(client.destroy(id).await.unwrap(), Destroyed::Destroyed);
    sim.shutdown().await;
}

#[tokio::test]
async fn pacing_keeps_under_the_limits_and_backoff_rides_out_429s() {
    // The documented limits, 10 times faster: gets 200 ms apart, creates 450 ms, lists 100 ms.
    let scenario = Scenario {
        rate_limits: RateLimits::default().scaled(10),
        ..fast_scenario()
    };
    let (sim, unpaced) = start(scenario).await;
    let offers = unpaced.search(&rtx_4090()).await.unwrap();
    let pod = label("uid-paced");
    let id = unpaced
        .buy(&pod, &offers, &request(&pod))
        .await
        .unwrap()
        .instance_id();

    // Without pacing, back-to-back gets hit the 200 ms limit, and backoff still gets answers.
    for _ in 0..5 {
        assert!(unpaced.get(id).await.unwrap().is_some());
    }
    assert!(
        sim.rate_limited(Route::Get) > 0,
        "the unpaced client met the limit"
    );

    // Paced over the limits, with room for requests that arrive late: no 429 at all.
    let ms = Duration::from_millis;
    let paces = Paces(HashMap::from([
        (ClientRoute::Get, Pace::interval(ms(300))),
        (ClientRoute::Create, Pace::interval(ms(700))),
        (ClientRoute::List, Pace::interval(ms(150))),
    ]));
    let paced = VastClient::new(
        VastConfig {
            paces,
            ..config(&sim)
        },
        VastKey::new(KEY.into()).unwrap(),
    )
    .unwrap();
    // The simulator's slots for this key are shared with the unpaced client: let them pass.
    tokio::time::sleep(ms(500)).await;
    let before = sim.rate_limited(Route::Get);
    for _ in 0..5 {
        assert!(paced.get(id).await.unwrap().is_some());
    }
    assert_eq!(
        sim.rate_limited(Route::Get),
        before,
        "pacing avoided every 429"
    );
    let before = sim.rate_limited(Route::Create);
    for (i, offer) in offers[1..3].iter().enumerate() {
        let pod = label(&format!("uid-paced-{i}"));
        paced
            .buy(&pod, std::slice::from_ref(offer), &request(&pod))
            .await
            .unwrap();
    }
    assert_eq!(sim.rate_limited(Route::Create), before);
    sim.shutdown().await;
}

/// Pods that searched together got the same cheapest offers: one bought by another pod since
/// is skipped, not bought again (refused, it would spend a create slot).
#[tokio::test]
async fn an_offer_bought_for_one_pod_is_not_tried_for_the_next() {
    let mut scenario = fast_scenario();
    scenario.offers = numbered_offers(3);
    let (sim, client) = start(scenario).await;
    let offers = client.search(&rtx_4090()).await.unwrap();
    assert_eq!(offers.len(), 3);
    let first = label("uid-first");
    let bought = client.buy(&first, &offers, &request(&first)).await.unwrap();
    assert!(matches!(bought, Bought::Created { offer_id, .. } if offer_id == offers[0].id));
    // The second pod's search was made at the same time: the same list.
    let second = label("uid-second");
    let bought = client
        .buy(&second, &offers, &request(&second))
        .await
        .unwrap();
    assert!(matches!(bought, Bought::Created { offer_id, .. } if offer_id == offers[1].id));
    assert_eq!(
        sim.requests(Route::Create),
        2,
        "the bought offer was not tried again"
    );
    sim.shutdown().await;
}

/// Vast.ai refuses every create for its penalty after one came early, and each refusal starts
/// the penalty again: creates queued at the interval must wait it out, not walk into it.
#[tokio::test]
async fn a_refused_create_waits_out_the_penalty_instead_of_restarting_it() {
    // The documented limits, 10 times faster: creates 450 ms apart, a 1.2 s penalty.
    let scenario = Scenario {
        rate_limits: RateLimits::default().scaled(10),
        offers: numbered_offers(8),
        ..fast_scenario()
    };
    let (sim, other_tool) = start(scenario).await;
    let offers = other_tool
        .search(&OfferQuery {
            limit: 20,
            ..rtx_4090()
        })
        .await
        .unwrap();
    assert!(offers.len() >= 5, "{} offers", offers.len());
    let paced = Arc::new(
        VastClient::new(
            VastConfig {
                paces: Paces::default().divided(10),
                ..config(&sim)
            },
            VastKey::new(KEY.into()).unwrap(),
        )
        .unwrap(),
    );
    // Another client of the same key buys just before: our first create comes early.
    let pod = label("uid-other-tool");
    other_tool
        .buy(&pod, &offers[..1], &request(&pod))
        .await
        .unwrap();
    let buys: Vec<_> = offers[1..5]
        .iter()
        .enumerate()
        .map(|(i, offer)| {
            let paced = paced.clone();
            let offer = offer.clone();
            tokio::spawn(async move {
                let pod = label(&format!("uid-queued-{i}"));
                paced
                    .buy(&pod, std::slice::from_ref(&offer), &request(&pod))
                    .await
            })
        })
        .collect();
    for buy in buys {
        buy.await.unwrap().unwrap();
    }
    let refused = sim.rate_limited(Route::Create);
    assert!(
        (1..=2).contains(&refused),
        "one early create is refused and the queue waits out the penalty; {refused} refusals"
    );
    assert_eq!(live_instances(&sim.ledger()).len(), 5);
    sim.shutdown().await;
}

#[tokio::test]
async fn keys_stay_secret_and_bad_settings_are_named() {
    let (sim, client) = start(fast_scenario()).await;
    assert!(!format!("{client:?}").contains("SECRET"));
    let wrong = VastClient::new(config(&sim), VastKey::new("wrong-key".into()).unwrap()).unwrap();
    let error = wrong.search(&rtx_4090()).await.unwrap_err();
    assert!(
        matches!(error, VastError::Unauthorized { status: 401, .. }),
        "{error:?}"
    );
    let misrouted = VastClient::new(
        VastConfig {
            api_url: format!("{}/api", sim.base_url()),
            ..config(&sim)
        },
        VastKey::new(KEY.into()).unwrap(),
    )
    .unwrap();
    let error = misrouted.get(1).await.unwrap_err();
    assert!(
        matches!(error, VastError::NoSuchEndpoint { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("--vastai-api-url"));
    assert!(!error.to_string().contains(KEY));
    assert!(VastKey::new("  ".into()).is_err());
    assert!(
        VastClient::new(
            VastConfig {
                api_url: "ftp://example".into(),
                ..VastConfig::default()
            },
            VastKey::new(KEY.into()).unwrap()
        )
        .is_err()
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn vastai_calls_429s_and_the_pacer_show_in_the_provider_labelled_metrics() {
    let scenario = Scenario {
        rate_limits: RateLimits::default().scaled(10),
        ..fast_scenario()
    };
    let (sim, _default_client) = start(scenario).await;
    let mut registry = prometheus_client::registry::Registry::with_prefix("runpod_kubelet");
    let api = runpod_kubelet::provider::metrics::CloudApiMetrics::register(&mut registry);
    // The default pacing (search 10 a minute) for the search; none for the gets, which meet
    // the simulator's limit.
    let ms = Duration::from_millis;
    let client = VastClient::new(
        VastConfig {
            paces: Paces(HashMap::from([(
                ClientRoute::Search,
                Pace {
                    interval: ms(10),
                    window: Some((10, ms(60_000))),
                    penalty: Duration::ZERO,
                },
            )])),
            ..config(&sim)
        },
        VastKey::new(KEY.into()).unwrap(),
    )
    .unwrap()
    .with_metrics(api.for_provider("vastai"));
    let offers = client.search(&rtx_4090()).await.unwrap();
    let pod = label("uid-metrics");
    let id = client
        .buy(&pod, &offers, &request(&pod))
        .await
        .unwrap()
        .instance_id();
    for _ in 0..5 {
        assert!(client.get(id).await.unwrap().is_some());
    }
    assert!(sim.rate_limited(Route::Get) > 0, "the gets met the limit");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        r#"runpod_kubelet_cloud_api_requests_total{provider="vastai",operation="search",outcome="ok"} 1"#,
        r#"runpod_kubelet_cloud_api_requests_total{provider="vastai",operation="get",outcome="rate_limited"}"#,
        r#"runpod_kubelet_cloud_api_requests_total{provider="vastai",operation="create",outcome="ok"} 1"#,
        r#"runpod_kubelet_cloud_api_request_duration_seconds_count{provider="vastai",operation="get"}"#,
        r#"runpod_kubelet_cloud_api_quota_remaining{provider="vastai",window="search/60s"} 9"#,
        r#"runpod_kubelet_cloud_api_limiter_delay_seconds{provider="vastai",operation="search"}"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    assert!(!text.contains(r#"provider="runpod""#), "{text}");
    sim.shutdown().await;
}
