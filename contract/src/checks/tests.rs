use super::*;

use crate::test_support::string_map as map;

/// The pod's own value wins over its Job's, a Job's value says where it came from, and only
/// user annotations are taken.
#[test]
fn effective_annotations_take_the_pods_first_then_its_jobs() {
    let pod = map(&[
        (contract::MAX_PRICE, "0.9"),
        ("example.com/other", "x"),
        (contract::PORTS, "80/http"),
    ]);
    let job = OwningJob {
        name: "train".to_owned(),
        annotations: map(&[
            (contract::MAX_PRICE, "0.2"),
            (contract::GPU_TYPES, "NVIDIA A40"),
            ("runpod.io/not-an-annotation", "y"),
        ]),
    };
    let effective = Effective::resolve(&pod, Some(&job));
    let seen: Vec<(&str, &str, Option<&str>)> = effective
        .iter()
        .map(|(key, sourced)| (key, sourced.value, sourced.job))
        .collect();
    let mut expected = vec![
        (contract::MAX_PRICE, "0.9", None),
        (contract::PORTS, "80/http", None),
        (contract::GPU_TYPES, "NVIDIA A40", Some("train")),
    ];
    expected.sort();
    assert_eq!(seen, expected);
    assert_eq!(
        Effective::resolve(&BTreeMap::<String, String>::new(), None)
            .iter()
            .count(),
        0
    );
    // Every user annotation is taken, from the pod and from the Job alike.
    let all: BTreeMap<String, String> = contract::USER_ANNOTATIONS
        .iter()
        .map(|key| ((*key).to_owned(), "v".to_owned()))
        .collect();
    let job = OwningJob {
        name: "j".to_owned(),
        annotations: all.clone(),
    };
    for effective in [
        Effective::resolve(&all, None),
        Effective::resolve(&BTreeMap::<String, String>::new(), Some(&job)),
    ] {
        assert_eq!(effective.iter().count(), contract::USER_ANNOTATIONS.len());
    }
}
