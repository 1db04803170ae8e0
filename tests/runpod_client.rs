//! The RunPod client against the simulator: every row of the error table, idempotent and
//! crash-safe creates, placement from the live catalogue, logs, and secret hygiene. Every
//! response the client saw is checked against `openapi-v2.json` at the end of each test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

mod runpod_support;

use futures::StreamExt;
use runpod_contract::CloudType;
use runpod_kubelet::http::ApiKey;
use runpod_kubelet::runpod::client::{Deleted, RunPodClient};
use runpod_kubelet::runpod::config::{ClientConfig, RetryPolicy};
use runpod_kubelet::runpod::error::ApiError;
use runpod_kubelet::runpod::limiter::Priority;
use runpod_kubelet::runpod::logs::{LogRequest, LogSource};
use runpod_kubelet::runpod::model::{CreatePodRequest, GpuSpec, PodAction, PodStatus};
use runpod_kubelet::runpod::placement::PlacementError;
use runpod_kubelet::runpod::select::{self, Candidate, ClusterLimits, Requirements};
use runpod_simulator::contract::SpecValidator;
use runpod_simulator::scenario::Scenario;
use runpod_simulator::{
    Effect, Fault, Match, Operation, Simulator, SimulatorHandle, duplicate_names, live_pods,
};
use runpod_support::{candidate, request_for};

const KEY: &str = "rpa_TESTKEY0123456789abcdefSECRET";
const RTX_4090: &str = "NVIDIA GeForce RTX 4090";
const A4000: &str = "NVIDIA RTX A4000";
const A6000: &str = "NVIDIA RTX A6000";

/// Short lifecycle delays, and a list that lags behind creates as RunPod's does (api-notes P3).
fn fast_scenario() -> Scenario {
    Scenario {
        provisioning_ms: 100,
        starting_ms: 100,
        ports_ms: 100,
        list_lag_ms: LIST_LAG_MS,
        ..Scenario::default()
    }
}

const LIST_LAG_MS: u64 = 300;

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        attempts: 4,
        base_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(100),
        lookup_attempts: 4,
        lookup_interval: Duration::from_millis(300),
    }
}

async fn start(scenario: Scenario) -> (SimulatorHandle, RunPodClient) {
    let sim = Simulator::start(scenario, Some(KEY.to_owned()))
        .await
        .unwrap();
    let client = client_for(&sim, KEY, ClientConfig::default());
    (sim, client)
}

fn client_for(sim: &SimulatorHandle, key: &str, config: ClientConfig) -> RunPodClient {
    client_at(&sim.base_url(), Duration::from_secs(5), key, config)
}

/// A client of the server root `url` with fast retries and this request timeout.
fn client_at(url: &str, timeout: Duration, key: &str, config: ClientConfig) -> RunPodClient {
    let config = ClientConfig {
        api_url: url.to_owned(),
        request_timeout: timeout,
        requests_per_minute: 600,
        retry: fast_retries(),
        ..config
    };
    RunPodClient::new(config, ApiKey::new(key.to_owned()).unwrap()).unwrap()
}

/// Every response the client saw matches the spec.
fn assert_contract(sim: &SimulatorHandle) {
    let violations = SpecValidator::load().check_all(&sim.exchanges());
    assert!(violations.is_empty(), "spec violations: {violations:#?}");
}

/// A fault answering `status` with `detail` (and `Retry-After`) to matching requests.
fn answer(when: Match, status: u16, detail: &str, retry_after: Option<u32>) -> Fault {
    Fault::new(
        when,
        Effect::Status {
            status,
            detail: Some(detail.to_owned()),
            retry_after,
        },
    )
}

/// `create_idempotent` for `name` on these GPU types (any data centre), with a fixed request.
async fn place(
    client: &RunPodClient,
    name: &str,
    gpus: &[&str],
) -> Result<runpod_kubelet::runpod::placement::Placement, PlacementError> {
    let candidates: Vec<Candidate> = gpus.iter().map(|gpu| candidate(gpu, &[])).collect();
    client
        .create_idempotent(name, &candidates, request_for(name))
        .await
}

fn creates(sim: &SimulatorHandle) -> usize {
    sim.exchanges()
        .iter()
        .filter(|ex| ex.operation == Some(Operation::CreatePod))
        .count()
}

#[tokio::test]
async fn a_create_known_absent_sends_no_lookup_but_still_settles_an_ambiguous_create() {
    let (sim, client) = start(fast_scenario()).await;
    let candidates = [candidate(RTX_4090, &[])];
    let placed = client
        .create_known_absent("ns-a-known", &candidates, request_for("ns-a-known"))
        .await
        .unwrap();
    let operations: Vec<_> = sim.exchanges().iter().map(|ex| ex.operation).collect();
    assert_eq!(
        operations,
        [Some(Operation::CreatePod)],
        "one call per create, no list before it"
    );
    assert_eq!(sim.ledger().len(), 1);
    // A 5xx after really creating: settled by lookups, never a second create.
    sim.inject(
        Fault::new(
            Match::operation(Operation::CreatePod),
            Effect::CreateThenFail { status: 502 },
        )
        .times(1),
    );
    let settled = client
        .create_known_absent("ns-b-known", &candidates, request_for("ns-b-known"))
        .await
        .unwrap();
    assert_eq!(creates(&sim), 2);
    assert_eq!(sim.ledger().len(), 2);
    assert_ne!(settled.pod.id, placed.pod.id);
    assert_contract(&sim);
}

#[tokio::test]
async fn a_create_known_absent_never_sends_an_unsettled_create_again() {
    // The list hides the new pod longer than the lookups after the 500 last: the controller's
    // create must not POST again (a second billed pod) but answer "unsettled", so that only a
    // settled list decides.
    let (sim, client) = start(Scenario {
        list_lag_ms: 3_000,
        ..fast_scenario()
    })
    .await;
    sim.inject(
        Fault::new(
            Match::operation(Operation::CreatePod),
            Effect::CreateThenFail { status: 500 },
        )
        .times(1),
    );
    let candidates = [candidate(RTX_4090, &[]), candidate(A4000, &[])];
    let error = client
        .create_known_absent("ns-u-known", &candidates, request_for("ns-u-known"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            PlacementError::Unsettled(ApiError::Server { status: 500, .. })
        ),
        "{error:?}"
    );
    assert_eq!(creates(&sim), 1, "one create, never sent again");
    assert_eq!(sim.ledger().len(), 1);
    assert_contract(&sim);
}

#[tokio::test]
async fn capacity_moves_to_the_next_candidate() {
    let (sim, client) = start(fast_scenario()).await;
    sim.inject(Fault::new(Match::any().gpu(RTX_4090), Effect::Capacity));
    let placed = place(&client, "ns-a-uid1", &[RTX_4090, A4000])
        .await
        .unwrap();
    assert_eq!(placed.pod.gpu.as_ref().unwrap().id, A4000);
    assert_eq!(placed.attempts.len(), 1);
    assert!(matches!(
        placed.attempts[0].error,
        ApiError::Capacity { .. }
    ));
    assert_eq!(sim.ledger().len(), 1);
    assert_contract(&sim);
}

#[tokio::test]
async fn capacity_everywhere_is_no_capacity_and_creates_nothing() {
    let (sim, client) = start(fast_scenario()).await;
    sim.inject(Fault::new(Match::any(), Effect::Capacity));
    let error = place(&client, "ns-b-uid2", &[RTX_4090, A4000])
        .await
        .unwrap_err();
    let PlacementError::NoCapacity { attempts } = &error else {
        panic!("expected NoCapacity, got {error:?}");
    };
    assert_eq!(attempts.len(), 2);
    assert!(sim.ledger().is_empty());
    assert_contract(&sim);
}

#[tokio::test]
async fn the_same_rule_400_on_every_candidate_blames_the_request() {
    let (sim, client) = start(fast_scenario()).await;
    sim.inject(answer(
        Match::operation(Operation::CreatePod),
        400,
        "disk must be at least the template's container disk",
        None,
    ));
    let error = place(&client, "ns-c-uid3", &[RTX_4090, A4000])
        .await
        .unwrap_err();
    assert!(
        matches!(&error, PlacementError::RequestRejected { detail, .. } if detail.contains("container disk")),
        "{error:?}"
    );
    assert_eq!(creates(&sim), 2);
    assert_contract(&sim);
}

#[tokio::test]
async fn invalid_422_is_never_retried() {
    let (sim, client) = start(fast_scenario()).await;
    let bad = |candidate: &Candidate| CreatePodRequest {
        gpu: GpuSpec {
            id: candidate.gpu_id.clone(),
            count: 0,
        },
        ..request_for("ns-d-uid4")(candidate)
    };
    let error = client
        .create_idempotent(
            "ns-d-uid4",
            &[candidate(RTX_4090, &[]), candidate(A4000, &[])],
            bad,
        )
        .await
        .unwrap_err();
    let PlacementError::Invalid(ApiError::Invalid { errors, .. }) = &error else {
        panic!("expected Invalid, got {error:?}");
    };
    assert!(!errors.is_empty(), "422 lists the violations");
    assert_eq!(creates(&sim), 1, "a 422 is not retried nor tried elsewhere");
    assert!(sim.ledger().is_empty());
    assert_contract(&sim);
}

#[tokio::test]
async fn payment_required_stops_at_once() {
    let (sim, client) = start(fast_scenario()).await;
    sim.inject(answer(
        Match::operation(Operation::CreatePod),
        402,
        "Insufficient balance",
        None,
    ));
    let error = place(&client, "ns-e-uid5", &[RTX_4090, A4000])
        .await
        .unwrap_err();
    assert!(
        matches!(error, PlacementError::PaymentRequired(_)),
        "{error:?}"
    );
    assert!(error.to_string().contains("balance"));
    assert_eq!(creates(&sim), 1);
    assert_contract(&sim);
}

#[tokio::test]
async fn forbidden_pool_skips_the_candidate() {
    let (sim, client) = start(fast_scenario()).await;
    sim.inject(answer(
        Match::operation(Operation::CreatePod).gpu(RTX_4090),
        403,
        "this key cannot use the pool",
        None,
    ));
    let placed = place(&client, "ns-f-uid6", &[RTX_4090, A6000])
        .await
        .unwrap();
    assert_eq!(placed.pod.gpu.unwrap().id, A6000);
    assert!(matches!(
        placed.attempts[0].error,
        ApiError::Forbidden { .. }
    ));
    assert_eq!(sim.ledger().len(), 1);
    assert_contract(&sim);
}

#[tokio::test]
async fn conflict_rereads_then_retries() {
    let (sim, client) = start(fast_scenario()).await;
    sim.inject(
        answer(
            Match::operation(Operation::CreatePod),
            409,
            "conflict",
            None,
        )
        .times(1),
    );
    let placed = place(&client, "ns-g-uid7", &[RTX_4090]).await.unwrap();
    assert_eq!(sim.ledger().len(), 1);
    assert_eq!(sim.ledger()[0].id, placed.pod.id);
    // The re-read happened between the two creates.
    let ops: Vec<_> = sim
        .exchanges()
        .iter()
        .filter_map(|ex| ex.operation)
        .collect();
    let first_create = ops
        .iter()
        .position(|op| *op == Operation::CreatePod)
        .unwrap();
    assert_eq!(ops[first_create + 1], Operation::ListPods);
    assert_contract(&sim);
}

#[tokio::test]
async fn rate_limited_create_waits_for_retry_after() {
    let (sim, client) = start(fast_scenario()).await;
    sim.inject(
        answer(
            Match::operation(Operation::CreatePod),
            429,
            "rate limit exceeded for the minute window",
            Some(1),
        )
        .times(1),
    );
    let started = std::time::Instant::now();
    place(&client, "ns-h-uid8", &[RTX_4090]).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After was honoured"
    );
    assert_eq!(sim.ledger().len(), 1);
    assert_eq!(creates(&sim), 2);
    assert_contract(&sim);
}

#[tokio::test]
async fn server_errors_are_retried_with_backoff() {
    let (sim, client) = start(fast_scenario()).await;
    sim.inject(
        answer(
            Match::operation(Operation::CreatePod),
            503,
            "upstream unavailable",
            None,
        )
        .times(2),
    );
    place(&client, "ns-i-uid9", &[RTX_4090]).await.unwrap();
    assert_eq!(creates(&sim), 3);
    assert_eq!(sim.ledger().len(), 1);
    assert_contract(&sim);
}

#[tokio::test]
async fn a_500_after_a_real_create_adopts_the_pod_despite_list_lag() {
    let (sim, client) = start(Scenario {
        list_lag_ms: 700,
        ..fast_scenario()
    })
    .await;
    sim.inject(
        Fault::new(
            Match::operation(Operation::CreatePod),
            Effect::CreateThenFail { status: 500 },
        )
        .times(1),
    );
    let placed = place(&client, "ns-j-uid10", &[RTX_4090, A4000])
        .await
        .unwrap();
    let ledger = sim.ledger();
    assert_eq!(ledger.len(), 1, "no second pod: {ledger:#?}");
    assert_eq!(ledger[0].create_status, 500);
    assert_eq!(placed.pod.id, ledger[0].id);
    assert!(placed.candidate.is_none(), "adopted, not created");
    assert!(
        !placed.possibly_duplicated,
        "the one create made the adopted pod"
    );
    assert_eq!(creates(&sim), 1);
    assert_contract(&sim);
}

#[tokio::test]
async fn a_retry_that_succeeds_after_an_unseen_create_reports_a_possible_duplicate() {
    // The list hides new pods longer than the lookups after the 500 last, so the client
    // retries and gets a 201 while the first pod exists unseen.
    const LAG_MS: u64 = 3_000;
    let (sim, client) = start(Scenario {
        list_lag_ms: LAG_MS,
        ..fast_scenario()
    })
    .await;
    sim.inject(
        Fault::new(
            Match::operation(Operation::CreatePod),
            Effect::CreateThenFail { status: 500 },
        )
        .times(1),
    );
    let name = "ns-j2-uid10b";
    let placed = place(&client, name, &[RTX_4090]).await.unwrap();
    assert_eq!(
        sim.ledger().len(),
        2,
        "the scenario makes a hidden duplicate"
    );
    assert!(placed.candidate.is_some(), "created by the retry");
    assert!(
        placed.duplicates.is_empty(),
        "the list still hides the first pod"
    );
    assert!(
        placed.possibly_duplicated,
        "the caller must be told to look again: {placed:?}"
    );
    // What the caller does with it: once the list has caught up, the extra pod shows.
    tokio::time::sleep(Duration::from_millis(LAG_MS + 200)).await;
    let listed = client.find_by_name(name, Priority::Create).await.unwrap();
    assert_eq!(listed.len(), 2);
    for extra in listed.iter().filter(|pod| pod.id != placed.pod.id) {
        client.delete_pod(&extra.id).await.unwrap();
    }
    assert_eq!(live_pods(&sim.ledger()).len(), 1);
    assert_contract(&sim);
}

#[tokio::test]
async fn a_timed_out_create_is_looked_up_before_creating_again() {
    let (sim, _) = start(fast_scenario()).await;
    // The answer comes after the client gave up; the pod exists all the same.
    let client = client_at(
        &sim.base_url(),
        Duration::from_millis(400),
        KEY,
        ClientConfig::default(),
    );
    sim.inject(
        Fault::new(
            Match::operation(Operation::CreatePod),
            Effect::Delay { millis: 1500 },
        )
        .times(1),
    );
    let placed = place(&client, "ns-k-uid11", &[RTX_4090]).await.unwrap();
    let ledger = sim.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:#?}");
    assert_eq!(placed.pod.id, ledger[0].id);
    assert_eq!(creates(&sim), 1);
}

#[tokio::test]
async fn creating_again_at_once_finds_the_pod_the_lagging_list_does_not_show() {
    let (sim, client) = start(Scenario {
        list_lag_ms: 5_000,
        ..fast_scenario()
    })
    .await;
    let first = place(&client, "ns-l-uid12", &[RTX_4090]).await.unwrap();
    // The same controller reconciles again right away: the list does not show the pod yet.
    assert!(
        client.list_pods().await.unwrap().is_empty(),
        "the list lags"
    );
    let second = place(&client, "ns-l-uid12", &[A4000]).await.unwrap();
    assert_eq!(first.pod.id, second.pod.id);
    assert!(second.candidate.is_none(), "adopted");
    assert_eq!(creates(&sim), 1);
    assert_eq!(sim.ledger().len(), 1);
    // Once deleted, the memory is gone too: a new pod may be created for the name.
    client.delete_pod(&first.pod.id).await.unwrap();
    let third = place(&client, "ns-l-uid12", &[RTX_4090]).await.unwrap();
    assert_ne!(third.pod.id, first.pod.id);
    assert_contract(&sim);
}

#[tokio::test]
async fn a_restarted_client_adopts_instead_of_duplicating() {
    let (sim, client) = start(fast_scenario()).await;
    let first = place(&client, "ns-l2-uid12", &[RTX_4090]).await.unwrap();
    // A new process (no memory of the create) after the list has caught up.
    drop(client);
    tokio::time::sleep(Duration::from_millis(LIST_LAG_MS + 200)).await;
    let restarted = client_for(&sim, KEY, ClientConfig::default());
    let second = place(&restarted, "ns-l2-uid12", &[A4000]).await.unwrap();
    assert_eq!(first.pod.id, second.pod.id);
    assert!(duplicate_names(&sim.ledger()).is_empty());
    assert_eq!(creates(&sim), 1);
    assert_contract(&sim);
}

#[tokio::test]
async fn a_wrong_api_url_is_an_error_never_already_deleted() {
    let (sim, client) = start(fast_scenario()).await;
    let placed = place(&client, "ns-w-uid19", &[RTX_4090]).await.unwrap();
    // A common mistake: the URL already ends in /v2, so every path is /v2/v2/...
    let misconfigured = client_at(
        &format!("{}/v2", sim.base_url()),
        Duration::from_secs(5),
        KEY,
        ClientConfig::default(),
    );
    let error = misconfigured.delete_pod(&placed.pod.id).await.unwrap_err();
    assert!(
        matches!(error, ApiError::NoSuchEndpoint { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("--runpod-api-url"));
    assert!(misconfigured.get_pod(&placed.pod.id).await.is_err());
    // The pod is still there and still billed: nothing was mistaken for a deletion.
    assert_eq!(live_pods(&sim.ledger()).len(), 1);
    assert_contract(&sim);
}

#[tokio::test]
async fn delete_is_idempotent_and_ends_billing() {
    let (sim, client) = start(fast_scenario()).await;
    let placed = place(&client, "ns-m-uid13", &[RTX_4090]).await.unwrap();
    assert_eq!(
        client.delete_pod(&placed.pod.id).await.unwrap(),
        Deleted::Terminated
    );
    assert_eq!(
        client.delete_pod(&placed.pod.id).await.unwrap(),
        Deleted::AlreadyGone
    );
    assert!(client.get_pod(&placed.pod.id).await.unwrap().is_none());
    assert!(live_pods(&sim.ledger()).is_empty());
    assert_contract(&sim);
}

#[tokio::test]
async fn pod_lifecycle_actions_and_conflicts() {
    let (sim, client) = start(fast_scenario()).await;
    let placed = place(&client, "ns-n-uid14", &[RTX_4090]).await.unwrap();
    assert_eq!(placed.pod.status, PodStatus::Provisioning);
    let id = placed.pod.id.clone();
    let running = wait_for(&client, &id, |pod| {
        pod.status == PodStatus::Running && !pod.published_ports().is_empty()
    })
    .await;
    assert!(running.cost.unwrap() > 0.0);
    assert!(
        running
            .published_ports()
            .iter()
            .any(|port| port.private == Some(22))
    );
    let stopped = client
        .pod_action(&id, PodAction::Stop)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stopped.status, PodStatus::Exited);
    assert_eq!(stopped.cost, Some(0.0));
    let error = client
        .pod_action(&id, PodAction::Restart)
        .await
        .unwrap_err();
    assert!(matches!(error, ApiError::Conflict { .. }), "{error:?}");
    assert_eq!(
        client.pod_action(&id, PodAction::Terminate).await.unwrap(),
        None
    );
    assert!(live_pods(&sim.ledger()).is_empty());
    assert_contract(&sim);
}

async fn wait_for(
    client: &RunPodClient,
    id: &str,
    ready: impl Fn(&runpod_kubelet::runpod::model::Pod) -> bool,
) -> runpod_kubelet::runpod::model::Pod {
    for _ in 0..100 {
        if let Some(pod) = client.get_pod(id).await.unwrap()
            && ready(&pod)
        {
            return pod;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("pod {id} never reached the expected state");
}

#[tokio::test]
async fn placement_from_the_live_catalogue_respects_every_constraint() {
    let (sim, client) = start(fast_scenario()).await;
    let catalogue = client.catalogue().await.unwrap();
    assert!(!catalogue.secure.is_empty() && !catalogue.data_centers.is_empty());
    let limits = ClusterLimits {
        max_gpu_price: 1.0,
        data_center_ids: vec!["EU-RO-1".into(), "US-TX-3".into()],
        cloud_types: Vec::new(),
    };
    let requirements = Requirements {
        gpu_count: 1,
        min_memory_gb: Some(24),
        gpu_types: vec![],
        cloud: CloudType::Secure,
        max_price_per_hour: None,
        allowed_data_centers: limits.data_center_ids.clone(),
    };
    let candidates = select::candidates(&catalogue, &requirements, &limits);
    assert!(!candidates.is_empty());
    for pair in candidates.windows(2) {
        assert!(pair[0].price_per_hour <= pair[1].price_per_hour);
    }
    let placed = client
        .create_idempotent("ns-o-uid15", &candidates, request_for("ns-o-uid15"))
        .await
        .unwrap();
    let entry = &sim.ledger()[0];
    assert!(
        limits.data_center_ids.contains(&entry.data_center_id),
        "{entry:?}"
    );
    assert_eq!(placed.pod.gpu.unwrap().id, candidates[0].gpu_id);
    assert!(entry.cost_per_hr <= 1.0);
    assert_contract(&sim);
}

#[tokio::test]
async fn logs_tail_follow_and_resume_without_loss_or_repeats() {
    let (sim, client) = start(fast_scenario()).await;
    let placed = place(&client, "ns-p-uid16", &[RTX_4090]).await.unwrap();
    let id = placed.pod.id.clone();
    wait_for(&client, &id, |pod| pod.status == PodStatus::Running).await;
    for n in 0..10 {
        assert!(sim.push_log(&id, &format!("line {n}")));
    }
    let container = |request: LogRequest| LogRequest {
        source: Some(LogSource::Container),
        quiet: Some(Duration::from_millis(300)),
        ..request
    };
    let tail: Vec<_> = client
        .logs(
            &id,
            container(LogRequest {
                tail: Some(3),
                ..LogRequest::default()
            }),
        )
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|line| line.unwrap().line)
        .collect();
    assert_eq!(tail, vec!["line 7", "line 8", "line 9"]);

    // Read four lines, stop, resume after the last one: exactly the rest, once each.
    let first: Vec<_> = client
        .logs(
            &id,
            container(LogRequest {
                tail: Some(10),
                ..LogRequest::default()
            }),
        )
        .take(4)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let resumed: Vec<_> = client
        .logs(
            &id,
            container(LogRequest {
                after_id: first[3].id.clone(),
                ..LogRequest::default()
            }),
        )
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|line| line.unwrap().line)
        .collect();
    let mut all: Vec<_> = first.iter().map(|line| line.line.clone()).collect();
    all.extend(resumed);
    assert_eq!(
        all,
        (0..10).map(|n| format!("line {n}")).collect::<Vec<_>>()
    );

    // Follow: a line written later arrives; the stream ends when the pod is terminated.
    let mut follow = Box::pin(client.logs(
        &id,
        container(LogRequest {
            tail: Some(0),
            follow: true,
            ..LogRequest::default()
        }),
    ));
    let pusher = {
        let sim_id = id.clone();
        let sim = &sim;
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(sim.push_log(&sim_id, "late line"));
        }
    };
    let (next, ()) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(5), follow.next()),
        pusher
    );
    assert_eq!(next.unwrap().unwrap().unwrap().line, "late line");
    client.delete_pod(&id).await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), follow.next())
        .await
        .unwrap();
    assert!(end.is_none(), "the stream ends with the pod: {end:?}");

    // Unknown pods are a clear 404.
    let missing = client
        .logs("nosuchpod00000", LogRequest::default())
        .next()
        .await
        .unwrap();
    assert!(matches!(missing, Err(ApiError::NotFound { .. })));
    assert_contract(&sim);
}

#[tokio::test]
async fn tolerant_decoding_of_every_read() {
    let (sim, client) = start(fast_scenario()).await;
    let gpus = client.gpu_types(CloudType::Community, 1).await.unwrap();
    // Types not offered on Community Cloud are listed too; placement must skip them.
    assert!(gpus.iter().any(|gpu| !gpu.community));
    let requirements = Requirements {
        gpu_count: 1,
        min_memory_gb: None,
        gpu_types: vec![],
        cloud: CloudType::Community,
        max_price_per_hour: None,
        allowed_data_centers: vec![],
    };
    let catalogue = client.catalogue().await.unwrap();
    let limits = ClusterLimits {
        max_gpu_price: 100.0,
        data_center_ids: vec![],
        cloud_types: Vec::new(),
    };
    let candidates = select::candidates(&catalogue, &requirements, &limits);
    assert!(!candidates.is_empty());
    for candidate in &candidates {
        let gpu = gpus.iter().find(|gpu| gpu.id == candidate.gpu_id).unwrap();
        assert!(
            gpu.community,
            "{} is not offered on Community Cloud",
            gpu.id
        );
    }
    assert!(
        gpus.iter()
            .any(|gpu| gpu.price_on(CloudType::Community).is_some())
    );
    assert!(client.list_pods().await.unwrap().is_empty());
    assert!(client.get_pod("nosuchpod00000").await.unwrap().is_none());
    assert_contract(&sim);
}

#[tokio::test]
async fn the_catalogue_cache_refreshes_and_keeps_the_last_good_one() {
    use runpod_kubelet::runpod::catalogue_cache::CatalogueCache;
    let (sim, client) = start(fast_scenario()).await;
    let cache = CatalogueCache::new();
    assert!(cache.get().is_none());
    let refresher = cache.spawn_refresher(client.clone(), Duration::from_millis(200));
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(first) = cache.get() {
                break first;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a first refresh");
    assert!(!first.catalogue.secure.is_empty());
    // It refreshes on the timer.
    let second = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let current = cache.get().unwrap();
            if current.fetched_at > first.fetched_at {
                break current;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a refresh on the timer");
    // RunPod failing: the last good catalogue stays.
    sim.inject(answer(
        Match::operation(Operation::ListGpuTypes),
        503,
        "upstream unavailable",
        None,
    ));
    // (A refresh already under way when the fault was injected may still land.)
    tokio::time::sleep(Duration::from_millis(400)).await;
    let kept = cache.get().unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let still = cache.get().unwrap();
    assert_eq!(
        still.fetched_at, kept.fetched_at,
        "no refresh succeeded while failing"
    );
    assert_eq!(still.catalogue, second.catalogue);
    refresher.abort();
    assert_contract(&sim);
}

/// A TCP proxy in front of the simulator whose open connections can be cut, to drop a
/// followed log stream the way a network or load-balancer hiccup would.
async fn cuttable_proxy(
    target: std::net::SocketAddr,
) -> (String, std::sync::Arc<tokio::sync::Notify>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let cut = std::sync::Arc::new(tokio::sync::Notify::new());
    let cut_all = std::sync::Arc::clone(&cut);
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let cut = std::sync::Arc::clone(&cut_all);
            tokio::spawn(async move {
                let mut outbound = tokio::net::TcpStream::connect(target).await.unwrap();
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    () = cut.notified() => {}
                }
            });
        }
    });
    (url, cut)
}

#[tokio::test]
async fn a_dropped_follow_stream_resumes_after_the_last_line_it_delivered() {
    let (sim, _) = start(fast_scenario()).await;
    let (url, cut) = cuttable_proxy(sim.addr()).await;
    let client = RunPodClient::new(
        ClientConfig {
            api_url: url,
            request_timeout: Duration::from_secs(5),
            retry: fast_retries(),
            ..ClientConfig::default()
        },
        ApiKey::new(KEY.to_owned()).unwrap(),
    )
    .unwrap();
    let placed = place(&client, "ns-q-uid17", &[RTX_4090]).await.unwrap();
    let id = placed.pod.id.clone();
    wait_for(&client, &id, |pod| pod.status == PodStatus::Running).await;
    assert!(sim.push_log(&id, "one"));
    let mut follow = client.logs(
        &id,
        LogRequest {
            source: Some(LogSource::Container),
            tail: Some(1),
            follow: true,
            ..LogRequest::default()
        },
    );
    assert_eq!(next_line(&mut follow).await, "one");
    cut.notify_waiters();
    assert!(sim.push_log(&id, "two"));
    assert!(sim.push_log(&id, "three"));
    assert_eq!(next_line(&mut follow).await, "two");
    assert_eq!(next_line(&mut follow).await, "three");
    assert!(sim.push_log(&id, "four"));
    assert_eq!(next_line(&mut follow).await, "four");
    let reconnects = sim
        .exchanges()
        .iter()
        .filter(|ex| ex.operation == Some(Operation::GetPodLogs))
        .count();
    assert!(
        reconnects >= 2,
        "the stream was reopened ({reconnects} log requests)"
    );
    client.delete_pod(&id).await.unwrap();
    assert_contract(&sim);
}

#[tokio::test]
async fn logs_since_a_moment_skip_older_lines() {
    let (sim, client) = start(fast_scenario()).await;
    let placed = place(&client, "ns-r-uid18", &[RTX_4090]).await.unwrap();
    let id = placed.pod.id.clone();
    wait_for(&client, &id, |pod| pod.status == PodStatus::Running).await;
    for line in ["old 1", "old 2"] {
        assert!(sim.push_log(&id, line));
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let since = k8s_openapi::jiff::Timestamp::now();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for line in ["new 1", "new 2"] {
        assert!(sim.push_log(&id, line));
    }
    let lines: Vec<_> = client
        .logs(
            &id,
            LogRequest {
                source: Some(LogSource::Container),
                since: Some(since),
                tail: Some(100),
                quiet: Some(Duration::from_millis(300)),
                ..LogRequest::default()
            },
        )
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|line| line.unwrap().line)
        .collect();
    assert_eq!(lines, vec!["new 1", "new 2"]);
    assert_contract(&sim);
}

async fn next_line(follow: &mut runpod_kubelet::runpod::logs::LogStream) -> String {
    tokio::time::timeout(Duration::from_secs(5), follow.next())
        .await
        .expect("a line within 5 s")
        .expect("stream still open")
        .expect("no error")
        .line
}

#[tokio::test]
async fn api_calls_429s_and_quota_show_in_the_metrics() {
    use runpod_kubelet::runpod::metrics::RunPodMetrics;
    let (sim, client) = start(fast_scenario()).await;
    let mut registry = prometheus_client::registry::Registry::with_prefix("runpod_kubelet");
    let api = runpod_kubelet::provider::metrics::CloudApiMetrics::register(&mut registry);
    let client = client.with_metrics(RunPodMetrics::register(
        &mut registry,
        api.for_provider("runpod"),
    ));
    sim.inject(
        answer(
            Match::operation(Operation::ListPods),
            429,
            "rate limit exceeded for the minute window",
            Some(1),
        )
        .times(1),
    );
    client.list_pods().await.unwrap();
    assert!(client.get_pod("nosuchpod00000").await.unwrap().is_none());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        r#"runpod_kubelet_runpod_api_requests_total{operation="listPods",outcome="rate_limited"} 1"#,
        r#"runpod_kubelet_runpod_api_requests_total{operation="listPods",outcome="ok"} 1"#,
        r#"runpod_kubelet_runpod_api_requests_total{operation="getPod",outcome="not_found"} 1"#,
        r#"runpod_kubelet_runpod_api_request_duration_seconds_count{operation="listPods"} 2"#,
        // The same calls in the provider-labelled families both clouds share.
        r#"runpod_kubelet_cloud_api_requests_total{provider="runpod",operation="listPods",outcome="rate_limited"} 1"#,
        r#"runpod_kubelet_cloud_api_requests_total{provider="runpod",operation="getPod",outcome="not_found"} 1"#,
        r#"runpod_kubelet_cloud_api_request_duration_seconds_count{provider="runpod",operation="listPods"} 2"#,
        r#"runpod_kubelet_cloud_api_limiter_delay_seconds{provider="runpod",operation="getPod"}"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    // The simulator's default minute quota is 60; three requests were counted.
    assert!(
        text.contains(r#"runpod_kubelet_runpod_api_quota_remaining{window="minute"} 57"#)
            || text.contains(r#"runpod_kubelet_runpod_api_quota_remaining{window="minute"} 58"#),
        "{text}"
    );
    assert_contract(&sim);
}

#[tokio::test]
async fn after_a_create_that_may_have_worked_no_other_gpu_is_tried() {
    // The list lags longer than the lookups after the failure, so the client cannot see the
    // pod its failed create made; then the same GPU type runs out (that pod took it).
    let (sim, client) = start(Scenario {
        list_lag_ms: 10_000,
        ..fast_scenario()
    })
    .await;
    sim.inject(
        Fault::new(
            Match::operation(Operation::CreatePod),
            Effect::CreateThenFail { status: 502 },
        )
        .times(1),
    );
    let placing = {
        let client = client.clone();
        tokio::spawn(async move { place(&client, "ns-s-uid20", &[RTX_4090, A4000]).await })
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while sim.ledger().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the first create reached the simulator");
    sim.inject(Fault::new(Match::any().gpu(RTX_4090), Effect::Capacity));
    let error = placing.await.unwrap().unwrap_err();
    assert!(
        matches!(
            error,
            PlacementError::Unsettled(ApiError::Server { status: 502, .. })
        ),
        "{error:?}"
    );
    let ledger = sim.ledger();
    assert_eq!(ledger.len(), 1, "no pod on the other GPU: {ledger:#?}");
    assert_eq!(ledger[0].gpu_id.as_deref(), Some(RTX_4090));
    assert_contract(&sim);
}

#[tokio::test]
async fn patch_updates_fields_and_a_locked_pod_must_be_unlocked_before_stopping() {
    use runpod_kubelet::runpod::model::UpdatePodRequest;
    let (sim, client) = start(fast_scenario()).await;
    let placed = place(&client, "ns-t-uid21", &[RTX_4090]).await.unwrap();
    let id = placed.pod.id.clone();
    wait_for(&client, &id, |pod| pod.status == PodStatus::Running).await;
    let locked = client
        .update_pod(
            &id,
            &UpdatePodRequest {
                locked: Some(true),
                ..UpdatePodRequest::default()
            },
        )
        .await
        .unwrap();
    assert!(locked.locked);
    // api-notes P18: a locked pod cannot be stopped.
    let refused = client.pod_action(&id, PodAction::Stop).await.unwrap_err();
    assert!(matches!(refused, ApiError::Conflict { .. }), "{refused:?}");
    let unlocked = client
        .update_pod(
            &id,
            &UpdatePodRequest {
                locked: Some(false),
                name: Some("ns-t-uid21".into()),
                ..UpdatePodRequest::default()
            },
        )
        .await
        .unwrap();
    assert!(!unlocked.locked);
    let stopped = client
        .pod_action(&id, PodAction::Stop)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stopped.status, PodStatus::Exited);
    // Patching a pod that is gone is a clear 404.
    client.delete_pod(&id).await.unwrap();
    let gone = client
        .update_pod(&id, &UpdatePodRequest::default())
        .await
        .unwrap_err();
    assert!(matches!(gone, ApiError::NotFound { .. }), "{gone:?}");
    assert_contract(&sim);
}
