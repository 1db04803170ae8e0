//! Unit tests of the limiter: header parsing, waits, the urgent reserve, out-of-order answers.

use super::headers::header_list;
use super::*;
use reqwest::header::HeaderValue;

fn headers(live: &str, policy: &str) -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert("ratelimit", HeaderValue::from_str(live).unwrap());
    map.insert("ratelimit-policy", HeaderValue::from_str(policy).unwrap());
    map
}

#[test]
fn parses_the_spec_examples() {
    let map = headers(
        r#""minute";r=0;t=12, "hour";r=2800;t=1812, "day";r=49500;t=45012"#,
        r#""minute";q=60;w=60, "hour";q=3000;w=3600, "day";q=50000;w=86400"#,
    );
    let live = header_list(&map, "ratelimit").unwrap();
    assert_eq!(live.len(), 3);
    assert_eq!(live[1].name, "hour");
    assert_eq!(live[1].get("r"), Some(2800));
    assert_eq!(live[2].get("t"), Some(45012));
    let policy = header_list(&map, "ratelimit-policy").unwrap();
    assert_eq!(policy[0].get("q"), Some(60));
    let mut broken = HeaderMap::new();
    broken.insert("ratelimit", HeaderValue::from_static("\"minute;r=0"));
    assert!(header_list(&broken, "ratelimit").is_none());
}

#[tokio::test(start_paused = true)]
async fn never_exceeds_the_configured_quota_before_any_header() {
    let limiter = RateLimiter::new(5);
    let start = Instant::now();
    for _ in 0..5 {
        drop(limiter.acquire(Priority::Create).await);
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    drop(limiter.acquire(Priority::Create).await);
    // The sixth waits for the local window (a minute plus the margin).
    assert!(start.elapsed() >= Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn follows_the_headers_and_waits_for_the_announced_reset() {
    let limiter = RateLimiter::new(60);
    let permit = limiter.acquire(Priority::Routine).await;
    permit.observe(
        &headers(
            r#""minute";r=0;t=7, "hour";r=10;t=100"#,
            r#""minute";q=60;w=60, "hour";q=3000;w=3600"#,
        ),
        None,
    );
    assert_eq!(
        limiter.windows(),
        vec![("minute".into(), 60, 0), ("hour".into(), 3000, 10)]
    );
    let start = Instant::now();
    drop(limiter.acquire(Priority::Create).await);
    // The announced 7 s plus the safety margin: never early.
    assert_eq!(start.elapsed(), Duration::from_secs(7) + RESET_MARGIN);
}

#[tokio::test(start_paused = true)]
async fn retry_after_blocks_everyone() {
    let limiter = RateLimiter::new(60);
    limiter
        .acquire(Priority::Create)
        .await
        .observe(&HeaderMap::new(), Some(Duration::from_secs(12)));
    let start = Instant::now();
    drop(limiter.acquire(Priority::Routine).await);
    assert_eq!(start.elapsed(), Duration::from_secs(12));
}

/// A fresh limiter's first request is a probe: answers it with the whole quota left.
async fn first_answer(limiter: &Arc<RateLimiter>, policy: &str) {
    limiter
        .acquire(Priority::Create)
        .await
        .observe(&headers(r#""minute";r=59;t=60"#, policy), None);
}

/// A 20-per-minute limiter after one poll whose answer reported `live`, and when it started.
async fn after_a_poll(live: &str) -> (Arc<RateLimiter>, Instant) {
    let limiter = RateLimiter::new(20);
    let start = Instant::now();
    let permit = limiter.acquire(Priority::Routine).await;
    permit.observe(&headers(live, r#""minute";q=20;w=60"#), None);
    (limiter, start)
}

/// Runs the labelled acquisitions (spawned in this order) and returns (label, time) in the
/// order they got their slot.
async fn race(
    limiter: &Arc<RateLimiter>,
    contenders: &[(&'static str, Priority)],
) -> Vec<(&'static str, Instant)> {
    let order = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = contenders
        .iter()
        .map(|&(label, priority)| {
            let limiter = Arc::clone(limiter);
            let order = Arc::clone(&order);
            tokio::spawn(async move {
                let _permit = limiter.acquire(priority).await;
                order.lock().unwrap().push((label, Instant::now()));
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    order.lock().unwrap().clone()
}

#[tokio::test(start_paused = true)]
async fn routine_requests_leave_a_reserve_for_urgent_ones_until_the_window_ends() {
    // 20 per minute: routine requests leave the last 2 slots to urgent ones.
    let (limiter, start) = after_a_poll(r#""minute";r=3;t=30"#).await;
    drop(limiter.acquire(Priority::Routine).await);
    let order = race(
        &limiter,
        &[
            ("poll", Priority::Routine),
            ("create", Priority::Create),
            ("stop", Priority::EndsBilling),
        ],
    )
    .await;
    let labels: Vec<_> = order.iter().map(|(label, _)| *label).collect();
    // Both had room (the reserve is theirs), so neither waited for the other.
    assert_eq!(labels, vec!["create", "stop", "poll"]);
    assert_eq!(order[1].1, start, "urgent requests did not wait");
    // The reserve was used up, so the poll waited for the window to end.
    assert_eq!(order[2].1 - start, Duration::from_secs(30) + RESET_MARGIN);
}

#[tokio::test(start_paused = true)]
async fn unused_reserve_is_released_when_our_own_requests_free_room_soon() {
    let (limiter, start) = after_a_poll(r#""minute";r=2;t=20"#).await;
    tokio::time::sleep(Duration::from_secs(40)).await;
    drop(limiter.acquire(Priority::Routine).await);
    // Two reserved slots left (the count going stale at 21 s frees nothing for sure); a
    // twelfth of the window before the first poll stops counting (61 s), and before this poll
    // has waited `ROUTINE_MAX_WAIT`, it may take them.
    assert_eq!(start.elapsed(), Duration::from_secs(56));
}

#[tokio::test(start_paused = true)]
async fn an_overdue_poll_may_take_the_reserve() {
    let (limiter, start) = after_a_poll(r#""minute";r=2;t=60"#).await;
    drop(limiter.acquire(Priority::Routine).await);
    // Released at 56 s otherwise; an overdue poll goes before urgent requests, so it may take
    // the slots kept for them.
    assert_eq!(start.elapsed(), ROUTINE_MAX_WAIT);
}

#[tokio::test(start_paused = true)]
async fn urgent_requests_overtake_routine_ones_queued_before_them() {
    let (limiter, start) = after_a_poll(r#""minute";r=0;t=10"#).await;
    let order = race(
        &limiter,
        &[
            ("poll 1", Priority::Routine),
            ("poll 2", Priority::Routine),
            ("create", Priority::Create),
        ],
    )
    .await;
    let labels: Vec<_> = order.iter().map(|(label, _)| *label).collect();
    assert_eq!(labels[0], "create");
    assert!(
        order
            .iter()
            .all(|(_, at)| *at - start == Duration::from_secs(10) + RESET_MARGIN)
    );
}

#[tokio::test(start_paused = true)]
async fn a_poll_that_waited_too_long_goes_before_a_queue_of_creates() {
    let (limiter, start) = after_a_poll(r#""minute";r=0;t=60"#).await;
    // Two windows' worth of creates are queued with the poll: without a limit on its wait, it
    // would go out after all of them, two minutes later.
    let mut contenders = vec![("poll", Priority::Routine)];
    contenders.extend(std::iter::repeat_n(("create", Priority::Create), 40));
    let order = race(&limiter, &contenders).await;
    let reset = start + Duration::from_secs(60) + RESET_MARGIN;
    assert_eq!(order[0], ("poll", reset), "the overdue poll goes first");
    assert!(
        order[1..]
            .iter()
            .all(|(label, at)| *label == "create" && *at >= reset)
    );
}

#[tokio::test(start_paused = true)]
async fn overdue_reads_and_deletes_take_turns() {
    let (limiter, start) = after_a_poll(r#""minute";r=0;t=60"#).await;
    // Thirty log reads are overdue at the reset; the deletes are not held back behind them.
    let mut contenders = vec![("read", Priority::Routine); 30];
    contenders.extend([("delete", Priority::EndsBilling); 3]);
    let order = race(&limiter, &contenders).await;
    let labels: Vec<_> = order.iter().take(6).map(|(label, _)| *label).collect();
    assert_eq!(
        labels,
        ["read", "delete", "read", "delete", "read", "delete"]
    );
    assert!(
        order[..6]
            .iter()
            .all(|(_, at)| *at - start == Duration::from_secs(60) + RESET_MARGIN)
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_overdue_poll_does_not_hold_back_deletes() {
    let (limiter, start) = after_a_poll(r#""minute";r=0;t=60"#).await;
    let poll = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move { drop(limiter.acquire(Priority::Routine).await) }
    });
    tokio::time::sleep(ROUTINE_MAX_WAIT + Duration::from_secs(5)).await;
    poll.abort();
    let _ = poll.await;
    let delete = tokio::time::timeout(
        Duration::from_secs(120),
        limiter.acquire(Priority::EndsBilling),
    );
    assert!(
        delete.await.is_ok(),
        "the delete waited for a poll that is gone"
    );
    assert_eq!(start.elapsed(), Duration::from_secs(60) + RESET_MARGIN);
}

#[tokio::test(start_paused = true)]
async fn a_poll_becomes_overdue_while_creates_wait_for_a_far_reset() {
    let (limiter, start) = after_a_poll(r#""minute";r=0;t=60"#).await;
    let order = race(
        &limiter,
        &[
            ("create 1", Priority::Create),
            ("poll", Priority::Routine),
            ("create 2", Priority::Create),
        ],
    )
    .await;
    let labels: Vec<_> = order.iter().map(|(label, _)| *label).collect();
    assert_eq!(labels[0], "poll");
    assert!(
        order
            .iter()
            .all(|(_, at)| *at - start == Duration::from_secs(60) + RESET_MARGIN)
    );
}

#[tokio::test(start_paused = true)]
async fn an_answer_caps_by_what_was_sent_around_it_and_an_older_answer_settles_the_race() {
    let limiter = RateLimiter::new(60);
    let policy = r#""minute";q=60;w=60"#;
    first_answer(&limiter, policy).await;
    let earlier = limiter.acquire(Priority::Create).await;
    let later = limiter.acquire(Priority::Create).await;
    // r=5 while another request sent with it is unanswered: it may not be counted yet.
    later.observe(&headers(r#""minute";r=5;t=30"#, policy), None);
    assert_eq!(limiter.windows(), vec![("minute".into(), 60, 4)]);
    let third = limiter.acquire(Priority::Create).await;
    assert_eq!(limiter.windows(), vec![("minute".into(), 60, 3)]);
    // The older request's higher count says the server took it first: the newer count has
    // both, and only the third is not in it.
    earlier.observe(&headers(r#""minute";r=6;t=30"#, policy), None);
    assert_eq!(limiter.windows(), vec![("minute".into(), 60, 4)]);
    // The newest count rules: nothing it may not have is unanswered (answered requests are
    // not counted twice, or a burst answered in order would leave quota unused).
    third.observe(&headers(r#""minute";r=4;t=30"#, policy), None);
    assert_eq!(limiter.windows(), vec![("minute".into(), 60, 4)]);
    assert_eq!(limiter.in_flight(), 0);
    // Once that count is stale, what it left is still left (our own requests only free room
    // as time passes).
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(limiter.windows(), vec![("minute".into(), 60, 4)]);
}

#[tokio::test(start_paused = true)]
async fn an_older_answer_never_raises_a_count_sent_well_after_it() {
    let limiter = RateLimiter::new(60);
    let policy = r#""minute";q=60;w=60"#;
    first_answer(&limiter, policy).await;
    let old = limiter.acquire(Priority::Create).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let new = limiter.acquire(Priority::Create).await;
    new.observe(&headers(r#""minute";r=5;t=30"#, policy), None);
    assert_eq!(limiter.windows(), vec![("minute".into(), 60, 5)]);
    old.observe(&headers(r#""minute";r=9;t=30"#, policy), None);
    assert_eq!(limiter.windows(), vec![("minute".into(), 60, 5)]);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_ended_without_a_count_may_be_missing_from_a_newer_one() {
    let limiter = RateLimiter::new(60);
    let policy = r#""minute";q=60;w=60"#;
    first_answer(&limiter, policy).await;
    let lost = limiter.acquire(Priority::Create).await;
    let later = limiter.acquire(Priority::Create).await;
    // The answer to the first is lost (a timeout): the server may have counted it after the
    // second, whose count then does not have it.
    drop(lost);
    later.observe(&headers(r#""minute";r=5;t=30"#, policy), None);
    assert_eq!(limiter.windows(), vec![("minute".into(), 60, 4)]);
}

#[tokio::test(start_paused = true)]
async fn a_burst_answered_in_order_leaves_the_exact_count() {
    let limiter = RateLimiter::new(60);
    let policy = r#""minute";q=60;w=60"#;
    first_answer(&limiter, policy).await;
    let mut burst = Vec::new();
    for _ in 0..20 {
        burst.push(limiter.acquire(Priority::Create).await);
    }
    // The server took them in order; 60 - 1 (the first answer) - 20 are left.
    for (index, permit) in burst.into_iter().enumerate() {
        let left = 58 - index;
        permit.observe(
            &headers(&format!(r#""minute";r={left};t=30"#), policy),
            None,
        );
    }
    assert_eq!(limiter.windows(), vec![("minute".into(), 60, 39)]);
}

#[tokio::test(start_paused = true)]
async fn caution_taken_for_out_of_order_answers_is_undone_once_all_are_in() {
    let limiter = RateLimiter::new(60);
    let policy = r#""minute";q=60;w=60"#;
    first_answer(&limiter, policy).await;
    let first = limiter.acquire(Priority::Routine).await;
    let second = limiter.acquire(Priority::Routine).await;
    // The service counted the second request first: the first's answer says r=5, but
    // the limiter cannot know the second is already in that count, so it assumes 4.
    first.observe(&headers(r#""minute";r=5;t=30"#, policy), None);
    assert_eq!(limiter.windows(), vec![("minute".into(), 60, 4)]);
    second.observe(&headers(r#""minute";r=6;t=30"#, policy), None);
    // Nothing in flight any more: the lowest reported value is the truth.
    assert_eq!(limiter.windows(), vec![("minute".into(), 60, 5)]);
}

/// Sends the whole quota of a 60-per-minute window, most of it late, keeps the first
/// `in_flight` requests unanswered while a waiting acquire of `priority` sees the reset,
/// then lets them end without an answer (timeouts during a RunPod stall). Returns how long
/// the waiter and one more acquire then took, or `None` if still waiting after two windows.
async fn wait_after_a_reset_with_requests_in_flight(
    in_flight: usize,
    priority: Priority,
) -> Option<Duration> {
    let limiter = RateLimiter::new(60);
    // The first request learns nothing (no counts): only the send log limits from then on.
    limiter
        .acquire(Priority::Create)
        .await
        .observe(&HeaderMap::new(), None);
    // Starts the window (it resets 61 s from now); the rest go past the reserve's release.
    let mut held = vec![limiter.acquire(Priority::Create).await];
    tokio::time::sleep(Duration::from_secs(57)).await;
    for _ in 0..58 {
        held.push(limiter.acquire(Priority::Create).await);
    }
    let waiter = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { drop(limiter.acquire(priority).await) })
    };
    tokio::time::sleep(Duration::from_millis(3500)).await;
    held.truncate(in_flight);
    // The waiter looks at the reset (61 s) while these are in flight; they time out later.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(held);
    let start = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(120), async {
        waiter.await.unwrap();
        drop(limiter.acquire(priority).await);
    })
    .await;
    outcome.ok().map(|()| start.elapsed())
}

#[tokio::test(start_paused = true)]
async fn deletes_still_go_out_after_a_reset_with_the_whole_quota_in_flight() {
    let waited = wait_after_a_reset_with_requests_in_flight(60, Priority::EndsBilling).await;
    assert!(waited.is_some(), "urgent requests locked out for good");
}

#[tokio::test(start_paused = true)]
async fn polls_still_go_out_after_a_reset_with_most_of_the_quota_in_flight() {
    let waited = wait_after_a_reset_with_requests_in_flight(54, Priority::Routine).await;
    assert!(waited.is_some(), "routine requests locked out for good");
}

#[tokio::test(start_paused = true)]
async fn a_list_split_over_header_lines_and_absurd_waits_are_handled() {
    let limiter = RateLimiter::new(60);
    let mut map = HeaderMap::new();
    map.append(
        "ratelimit",
        HeaderValue::from_static(r#""minute";r=10;t=30"#),
    );
    map.append("ratelimit", HeaderValue::from_static(r#""hour";r=5;t=900"#));
    map.append(
        "ratelimit-policy",
        HeaderValue::from_static(r#""minute";q=60;w=60"#),
    );
    map.append(
        "ratelimit-policy",
        HeaderValue::from_static(r#""hour";q=3000;w=3600"#),
    );
    limiter.acquire(Priority::Routine).await.observe(&map, None);
    assert_eq!(
        limiter.windows(),
        vec![("minute".into(), 60, 10), ("hour".into(), 3000, 5)]
    );
    // A nonsensical Retry-After neither panics nor blocks for longer than the cap.
    limiter
        .acquire(Priority::Routine)
        .await
        .observe(&HeaderMap::new(), Some(Duration::from_secs(u64::MAX / 2)));
    let start = Instant::now();
    drop(limiter.acquire(Priority::EndsBilling).await);
    assert_eq!(start.elapsed(), MAX_ANNOUNCED_WAIT);
}

#[tokio::test(start_paused = true)]
async fn money_goes_first_stops_then_cleanups_then_creates_then_reads() {
    let (limiter, start) = after_a_poll(r#""minute";r=0;t=10"#).await;
    let order = race(
        &limiter,
        &[
            ("read", Priority::Routine),
            ("create", Priority::Create),
            ("cleanup", Priority::Cleanup),
            ("stop", Priority::EndsBilling),
            ("create", Priority::Create),
            ("stop", Priority::EndsBilling),
            ("cleanup", Priority::Cleanup),
        ],
    )
    .await;
    let labels: Vec<_> = order.iter().map(|(label, _)| *label).collect();
    assert_eq!(
        labels,
        [
            "stop", "stop", "cleanup", "cleanup", "create", "create", "read"
        ]
    );
    assert!(
        order
            .iter()
            .all(|(_, at)| *at - start >= Duration::from_secs(10))
    );
}

#[tokio::test(start_paused = true)]
async fn a_sliding_window_is_never_overrun_by_a_reset_it_does_not_have() {
    // A sliding-window server answers "t=60" (its whole quota back a minute after the
    // newest request): 20 requests spread over 30 s count until 60 s after each was sent,
    // so at 61 s only the first ones may be replaced, not a whole new quota.
    let limiter = RateLimiter::new(20);
    let start = Instant::now();
    for i in 0..20u32 {
        tokio::time::sleep_until(start + Duration::from_millis(1500) * i).await;
        let permit = limiter.acquire(Priority::Create).await;
        permit.observe(
            &headers(
                &format!(r#""minute";r={};t=60"#, 19 - i),
                r#""minute";q=20;w=60"#,
            ),
            None,
        );
    }
    let mut sent = Vec::new();
    for _ in 0..3 {
        let permit = limiter.acquire(Priority::Create).await;
        sent.push(start.elapsed());
        drop(permit);
    }
    // Each replaces one sent 61 s (60 plus the margin) earlier, never sooner.
    for (i, at) in sent.iter().enumerate() {
        let replaced = Duration::from_millis(1500) * u32::try_from(i).unwrap();
        assert!(*at >= replaced + Duration::from_secs(61), "{sent:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_newest_count_caps_what_another_client_left_and_a_probe_follows() {
    let limiter = RateLimiter::new(60);
    let policy = r#""minute";q=60;w=60"#;
    // Another client of the same account used most of the quota.
    let start = Instant::now();
    limiter
        .acquire(Priority::Create)
        .await
        .observe(&headers(r#""minute";r=2;t=20"#, policy), None);
    drop(limiter.acquire(Priority::Create).await);
    drop(limiter.acquire(Priority::Create).await);
    assert_eq!(start.elapsed(), Duration::ZERO);
    // The third waits for the count to go stale, then goes alone as a probe…
    let probe = limiter.acquire(Priority::Create).await;
    assert_eq!(start.elapsed(), Duration::from_secs(21));
    let next = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move {
            drop(limiter.acquire(Priority::Create).await);
            Instant::now()
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !next.is_finished(),
        "a second request went before the probe's answer"
    );
    // …and its answer opens the window again.
    probe.observe(&headers(r#""minute";r=40;t=40"#, policy), None);
    assert_eq!(next.await.unwrap() - start, Duration::from_secs(23));
}

#[tokio::test(start_paused = true)]
async fn a_429_without_headers_teaches_the_quota_of_a_server_that_sends_none() {
    // Configured for 60 a minute; the server allows 5 and sends no counts at all.
    let limiter = RateLimiter::new(60);
    for _ in 0..5 {
        drop(limiter.acquire(Priority::Create).await);
    }
    limiter
        .acquire(Priority::Create)
        .await
        .observe(&HeaderMap::new(), Some(Duration::from_secs(3)));
    assert_eq!(limiter.windows()[0].1, 5);
    let start = Instant::now();
    drop(limiter.acquire(Priority::Create).await);
    // Not after the 3 s Retry-After: after the first five have left the minute.
    assert_eq!(start.elapsed(), Duration::from_secs(61));
}

#[tokio::test(start_paused = true)]
async fn a_fresh_limiter_probes_before_it_trusts_its_configured_quota() {
    // A previous leader may have used most of the quota: the first request goes alone.
    let limiter = RateLimiter::new(60);
    let probe = limiter.acquire(Priority::Create).await;
    let next = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move {
            let mut times = Vec::new();
            for _ in 0..3 {
                drop(limiter.acquire(Priority::Create).await);
                times.push(Instant::now());
            }
            times
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !next.is_finished(),
        "a request went before the probe's answer"
    );
    let start = Instant::now();
    probe.observe(
        &headers(r#""minute";r=2;t=30"#, r#""minute";q=60;w=60"#),
        None,
    );
    // Two go at once; the third waits for that count to go stale.
    let times = next.await.unwrap();
    assert_eq!(times[1], start);
    assert_eq!(times[2] - start, Duration::from_secs(31));
}

#[tokio::test(start_paused = true)]
async fn a_stale_count_still_allows_what_it_left() {
    // A GCRA server answering "t=1" on an idle bucket: the count goes stale at once, but the
    // room it reported stays (no probe round trip per request).
    let limiter = RateLimiter::new(60);
    limiter.acquire(Priority::Create).await.observe(
        &headers(r#""minute";r=59;t=1"#, r#""minute";q=60;w=60"#),
        None,
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let start = Instant::now();
    let held: Vec<_> =
        futures_util::future::join_all((0..10).map(|_| limiter.acquire(Priority::Create))).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn a_lone_refusal_after_a_failover_teaches_nothing() {
    // The old leader used the quota; one request of ours went, the next is refused.
    let limiter = RateLimiter::new(60);
    drop(limiter.acquire(Priority::Create).await);
    limiter
        .acquire(Priority::Create)
        .await
        .observe(&HeaderMap::new(), Some(Duration::from_secs(3)));
    assert_eq!(limiter.windows()[0].1, 60);
}
