use super::*;

/// Every name each cloud's notes list for a GPU the spec requires, with the model it must be.
const FROM_THE_NOTES: &[(Cloud, &str, Option<f64>, &str)] = &[
    (Cloud::RunPod, "NVIDIA H100 80GB HBM3", None, "H100"),
    (Cloud::RunPod, "NVIDIA H100 PCIe", None, "H100-PCIE"),
    (Cloud::RunPod, "NVIDIA H200", None, "H200"),
    (Cloud::RunPod, "NVIDIA A100-SXM4-80GB", None, "A100-80GB"),
    (
        Cloud::RunPod,
        "NVIDIA A100 80GB PCIe",
        None,
        "A100-80GB-PCIE",
    ),
    (Cloud::RunPod, "NVIDIA A100-SXM4-40GB", None, "A100"),
    (Cloud::RunPod, "NVIDIA L40S", None, "L40S"),
    (Cloud::RunPod, "NVIDIA L40", None, "L40"),
    (Cloud::RunPod, "NVIDIA L4", None, "L4"),
    (Cloud::RunPod, "NVIDIA RTX A6000", None, "RTXA6000"),
    (Cloud::RunPod, "NVIDIA RTX A5000", None, "RTXA5000"),
    (Cloud::RunPod, "NVIDIA RTX A4000", None, "RTXA4000"),
    (Cloud::RunPod, "NVIDIA A40", None, "A40"),
    (Cloud::RunPod, "NVIDIA GeForce RTX 5090", None, "RTX5090"),
    (Cloud::RunPod, "NVIDIA GeForce RTX 4090", None, "RTX4090"),
    (Cloud::RunPod, "NVIDIA GeForce RTX 3090", None, "RTX3090"),
    (Cloud::RunPod, "NVIDIA  RTX A4500", None, "RTXA4500"),
    (
        Cloud::RunPod,
        "NVIDIA GeForce RTX 3080TI",
        None,
        "RTX3080-Ti",
    ),
    (
        Cloud::RunPod,
        "NVIDIA RTX 4000 Ada Generation",
        None,
        "RTX4000-Ada",
    ),
    (Cloud::RunPod, "AMD Instinct MI300X OAM", None, "MI300X"),
    (Cloud::VastAi, "H100 SXM", Some(81.5), "H100"),
    (Cloud::VastAi, "H100 PCIE", Some(81.5), "H100-PCIE"),
    (Cloud::VastAi, "H200", Some(143.0), "H200"),
    (Cloud::VastAi, "A100 SXM4", Some(81.9), "A100-80GB"),
    (Cloud::VastAi, "A100 SXM4", Some(40.9), "A100"),
    (Cloud::VastAi, "A100 PCIE", Some(80.0), "A100-80GB-PCIE"),
    (Cloud::VastAi, "A100 PCIE", Some(40.0), "A100-PCIE"),
    (Cloud::VastAi, "Tesla V100", Some(16.1), "V100"),
    (Cloud::VastAi, "Tesla V100", Some(32.5), "V100-32GB"),
    (Cloud::VastAi, "RTX 4090", Some(24.5), "RTX4090"),
    (Cloud::VastAi, "RTX_3090", Some(24.0), "RTX3090"),
    (Cloud::VastAi, "RTX A6000", Some(48.0), "RTXA6000"),
    (Cloud::VastAi, "L40S", Some(46.0), "L40S"),
    (Cloud::VastAi, "L4", Some(23.0), "L4"),
];

#[test]
fn each_clouds_names_from_the_notes_resolve() {
    for (cloud, name, memory, expected) in FROM_THE_NOTES {
        assert_eq!(
            identify(*cloud, name, *memory).map(|m| m.name),
            Some(*expected),
            "{cloud} {name:?} ({memory:?} GB)"
        );
        // What a user writes in that cloud's spelling means that model (among others where
        // the cloud's name is shared by several sizes).
        assert!(
            resolve(name).iter().any(|m| m.name == *expected),
            "{name:?} resolves to {expected}"
        );
    }
}

#[test]
fn the_spec_names_exist_with_their_memory() {
    for (name, memory) in [
        ("H200", 141),
        ("H100", 80),
        ("H100-PCIE", 80),
        ("A100-80GB", 80),
        ("A100-80GB-PCIE", 80),
        ("A100", 40),
        ("L40S", 48),
        ("L40", 48),
        ("L4", 24),
        ("RTXA6000", 48),
        ("RTXA5000", 24),
        ("RTXA4000", 16),
        ("A40", 48),
        ("RTX5090", 32),
        ("RTX4090", 24),
        ("RTX3090", 24),
    ] {
        assert_eq!(by_name(name).map(|m| m.memory_gb), Some(memory), "{name}");
    }
}

#[test]
fn every_canonical_name_maps_both_ways() {
    let mut seen = std::collections::BTreeSet::new();
    for model in CATALOGUE {
        assert!(seen.insert(normalize(model.name)), "{} twice", model.name);
        // The price annotation separates name and count with a lower-case x.
        assert!(
            !model.name.contains('x'),
            "{} has a lower-case x",
            model.name
        );
        assert_eq!(resolve(model.name), vec![model], "{}", model.name);
        assert!(
            !model.runpod.is_empty() || !model.vastai.is_empty(),
            "{} is sold nowhere",
            model.name
        );
        for cloud in Cloud::ALL {
            for own in model.names_on(cloud) {
                // The cloud's name, with this model's memory, comes back to this model.
                assert_eq!(
                    identify(cloud, own, Some(f64::from(model.memory_gb))).map(|m| m.name),
                    Some(model.name),
                    "{cloud} {own:?}"
                );
                assert!(names_on(&[model.name.to_owned()], cloud).contains(&own.to_string()));
            }
        }
        // And a canonical name is never some other model's cloud spelling.
        for other in CATALOGUE.iter().filter(|o| o.name != model.name) {
            assert!(
                !other
                    .runpod
                    .iter()
                    .chain(other.vastai)
                    .any(|own| normalize(own) == normalize(model.name)),
                "{} is also a name of {}",
                model.name,
                other.name
            );
        }
    }
    // RunPod ids are unique: a catalogue id is exactly one model.
    let mut ids = std::collections::BTreeSet::new();
    for id in CATALOGUE.iter().flat_map(|m| m.runpod) {
        assert!(ids.insert(normalize(id)), "{id} twice");
    }
}

#[test]
fn case_spaces_and_underscores_are_ignored() {
    for spelling in [
        "h100",
        " H100 ",
        "nvidia h100 80gb hbm3",
        "H100_SXM",
        "h100sxm",
    ] {
        assert_eq!(
            resolve(spelling).iter().map(|m| m.name).collect::<Vec<_>>(),
            ["H100"],
            "{spelling:?}"
        );
    }
    assert_eq!(
        resolve("A100 SXM4")
            .iter()
            .map(|m| m.name)
            .collect::<Vec<_>>(),
        ["A100-80GB", "A100"],
        "Vast.ai's shared name stands for both sizes"
    );
    let floor = |names: &[&str], cloud| {
        memory_floor_gb(
            &names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
            cloud,
        )
    };
    assert_eq!(floor(&["A100-80GB"], Cloud::VastAi), Some(80));
    assert_eq!(floor(&["A100-80GB", "H100", "L4"], Cloud::VastAi), Some(24));
    assert_eq!(floor(&["A100 SXM4"], Cloud::RunPod), Some(40));
    assert_eq!(
        floor(&["A100 SXM4"], Cloud::VastAi),
        None,
        "every size sold under it"
    );
    assert_eq!(floor(&["A100-80GB", "Brand New"], Cloud::VastAi), None);
    assert!(resolve("H100X").is_empty());
    assert!(resolve("").is_empty());
}

#[test]
fn a_list_is_matched_by_model_in_its_order() {
    let wanted = vec!["RTX4090".to_owned(), "A100-80GB".to_owned()];
    assert_eq!(
        preference(&wanted, Cloud::RunPod, "NVIDIA GeForce RTX 4090", None),
        Some(0)
    );
    assert_eq!(
        preference(&wanted, Cloud::VastAi, "A100 SXM4", Some(80.0)),
        Some(1)
    );
    assert_eq!(
        preference(&wanted, Cloud::VastAi, "A100 SXM4", Some(40.0)),
        None,
        "a 40 GB A100 is not an A100-80GB"
    );
    // A cloud's own spelling means exactly what it sells under that name: Vast.ai's
    // `A100 SXM4` is never an `A100 PCIE`, and RunPod gets only the SXM4 cards for it.
    let sxm4 = vec!["A100 SXM4".to_owned()];
    assert_eq!(names_on(&sxm4, Cloud::VastAi), ["A100 SXM4"]);
    assert_eq!(
        preference(&sxm4, Cloud::VastAi, "A100 PCIE", Some(40.0)),
        None
    );
    assert_eq!(
        names_on(&sxm4, Cloud::RunPod),
        ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB"]
    );
    assert_eq!(
        names_on(&["A100 PCIE".to_owned()], Cloud::RunPod),
        ["NVIDIA A100 80GB PCIe"]
    );
    assert_eq!(
        preference(
            &["A100 PCIE".to_owned()],
            Cloud::RunPod,
            "NVIDIA A100-SXM4-40GB",
            Some(40.0)
        ),
        None
    );
    // The cloud's shared name accepts both sizes; a verbatim unknown name still matches itself.
    let vast = vec!["A100 SXM4".to_owned(), "Brand New GPU".to_owned()];
    assert_eq!(
        preference(&vast, Cloud::VastAi, "A100 SXM4", Some(40.0)),
        Some(0)
    );
    assert_eq!(
        preference(&vast, Cloud::RunPod, "NVIDIA A100-SXM4-80GB", None),
        Some(0),
        "RunPod's SXM4 A100 is the model the Vast.ai name stands for"
    );
    assert_eq!(
        preference(&vast, Cloud::VastAi, "brand new gpu", None),
        Some(1)
    );
    assert_eq!(names_on(&wanted, Cloud::VastAi), ["RTX 4090", "A100 SXM4"]);
    assert_eq!(
        names_on(&["RTX 4090".to_owned()], Cloud::RunPod),
        ["NVIDIA GeForce RTX 4090"]
    );
}

#[test]
fn unknown_names_are_refused_with_the_known_ones() {
    assert_eq!(check_list("H100, NVIDIA GeForce RTX 4090,RTX 3090"), Ok(()));
    let problem = check_list("H100,H100X").unwrap_err();
    assert!(problem.contains("\"H100X\""), "{problem}");
    assert!(problem.contains("A100-80GB") && problem.contains("RTX4090"));
    assert!(check_list("H100,,L4").is_err());
}

#[test]
fn prices_round_trip_and_merge_counts() {
    let prices = GpuPrices::from_observations(
        (1..=8).map(|n| ("H100", n, Some("SECURE"), 2.99)).chain([
            ("RTX4090", 1, None, 0.40),
            ("RTX4090", 1, None, 0.30),
            ("RTX4090", 2, None, 0.35),
            ("Nonesuch", 1, None, 0.01),
            ("L4", 0, None, 0.2),
            ("L4", 1, None, f64::NAN),
        ]),
        Some(0.15 / 720.0),
    );
    let text = prices.format();
    assert!(text.contains("H100x1-8:SECURE=2.99"), "{text}");
    assert!(text.contains("RTX4090x1=0.3,RTX4090x2=0.35"), "{text}");
    assert!(
        text.starts_with("storage="),
        "read before any bound: {text}"
    );
    // Merging overlapping sheets keeps the lowest per key, bounded.
    let mut merged = prices.clone();
    merged.merge(GpuPrices::parse(
        "H100x2-3:SECURE=2.5,RTX4090x1=0.35,at=600",
    ));
    let merged_text = merged.format();
    assert!(
        merged_text.contains("H100x1:SECURE=2.99,H100x2-3:SECURE=2.5,H100x4-8:SECURE=2.99")
            && merged_text.contains("RTX4090x1=0.3,"),
        "{merged_text}"
    );
    assert_eq!(merged.published_at, Some(600));
    let mut many = GpuPrices::default();
    for _ in 0..10 {
        many.merge(prices.clone());
    }
    assert_eq!(many.quotes, prices.quotes, "no duplicates pile up");
    assert!(!text.contains("Nonesuch") && !text.contains("L4"), "{text}");
    let back = GpuPrices::parse(&text);
    assert_eq!(back.quotes, prices.quotes);
    // Stamped to five minutes; stale after a quarter of an hour without a new stamp.
    let stamped = GpuPrices::parse(&prices.clone().stamped(1_000_123).format());
    assert_eq!(stamped.published_at, Some(999_900));
    assert_eq!(stamped.quotes, prices.quotes);
    assert!(stamped.fresh(1_000_123 + 600));
    assert!(!stamped.fresh(1_000_123 + 3600));
    assert!(
        back.fresh(i64::MAX),
        "a node that does not say is not judged"
    );
    assert!((back.storage_per_gb_hour.unwrap() - 0.15 / 720.0).abs() < 1e-6);
    // Malformed entries are skipped, the rest kept.
    let odd =
        GpuPrices::parse("H100x1:SECURE=2,bogus,H100x0=1,H100x3-2=1,Foox1=1,L4x1=-1,L4x1=0.2");
    assert_eq!(odd.quotes.len(), 2, "{odd:?}");
    assert_eq!(
        prices.lowest_per_class("ANY"),
        [("ANY".to_owned(), 0.3), ("SECURE".to_owned(), 2.99)]
    );
}

#[test]
fn the_cheapest_fit_honours_types_memory_count_class_and_cap() {
    let prices = GpuPrices::parse(
        "H100x1-8:SECURE=2.99,H100x1-8:COMMUNITY=2.69,RTX4090x1-4:SECURE=0.44,\
         A100-80GBx1-8:SECURE=1.64",
    );
    let need = |types: &[&str], memory: Option<u32>, count: u32, class: &str| Need {
        gpu_types: types.iter().map(|t| (*t).to_owned()).collect(),
        min_memory_gb: memory,
        gpu_count: count,
        class: Some(class.to_owned()),
        disk_gb: 0,
    };
    let h100 = prices.cheapest_fit(&need(&["H100"], None, 2, "SECURE"), None);
    assert_eq!(h100.cheapest.as_ref().map(|f| f.gpu), Some("H100"));
    assert!((h100.cheapest.unwrap().per_hour - 5.98).abs() < 1e-9);
    // Any type with 48 GB or more: the A100-80GB, not the cheaper RTX 4090.
    let big = prices.cheapest_fit(&need(&[], Some(48), 1, "SECURE"), None);
    assert_eq!(big.cheapest.map(|f| f.gpu), Some("A100-80GB"));
    // Five RTX 4090s are more than RunPod publishes.
    let many = prices.cheapest_fit(&need(&["RTX 4090"], None, 5, "SECURE"), None);
    assert_eq!(many, Fits::default());
    // The class counts; a cap below the fit leaves only `cheapest`.
    let community = prices.cheapest_fit(
        &need(&["NVIDIA H100 80GB HBM3"], None, 1, "COMMUNITY"),
        Some(2.0),
    );
    assert_eq!(community.cheapest.map(|f| f.per_hour), Some(2.69));
    assert_eq!(community.within_cap, None);
    // Disk is priced in where the cloud prices it.
    let vast = GpuPrices::parse("H100x1=2.1,storage=0.001");
    let fits = vast.cheapest_fit(
        &Need {
            gpu_types: vec!["H100 SXM".into()],
            gpu_count: 1,
            disk_gb: 100,
            ..Need::default()
        },
        None,
    );
    assert!((fits.cheapest.unwrap().per_hour - 2.2).abs() < 1e-9);
}

#[test]
fn normalizes_to_agrees_with_normalize() {
    for name in [
        "RTX_4090",
        "rtx 4090",
        "RTX 4090",
        "A100-80GB",
        "Ä100 x",
        "",
        " _ ",
    ] {
        let wanted = normalize(name);
        assert!(normalizes_to(name, &wanted), "{name}");
        assert!(!normalizes_to(name, &format!("{wanted}x")), "{name}");
    }
    assert!(!normalizes_to("RTX 4090", "rtx409"));
}

/// The index answers as a scan of the catalogue would, for every name either cloud or the
/// catalogue uses, in any spelling.
#[test]
fn the_index_answers_as_a_scan_of_the_catalogue() {
    let scan_by_name = |name: &str| {
        let wanted = normalize(name);
        CATALOGUE.iter().find(|m| normalizes_to(m.name, &wanted))
    };
    let scan_sold_as = |cloud: Cloud, name: &str| -> Vec<&'static GpuModel> {
        let wanted = normalize(name);
        CATALOGUE
            .iter()
            .filter(|m| {
                m.names_on(cloud)
                    .iter()
                    .any(|own| normalizes_to(own, &wanted))
            })
            .collect()
    };
    let mut names: Vec<String> = Vec::new();
    for model in CATALOGUE {
        names.push(model.name.to_owned());
        names.extend(
            model
                .runpod
                .iter()
                .chain(model.vastai)
                .map(|n| (*n).to_owned()),
        );
    }
    let spellings: Vec<String> = names
        .iter()
        .flat_map(|n| {
            [
                n.clone(),
                n.to_uppercase(),
                n.replace(' ', "_"),
                format!("{n}x"),
            ]
        })
        .collect();
    for name in &spellings {
        assert_eq!(by_name(name), scan_by_name(name), "{name}");
        for cloud in [Cloud::RunPod, Cloud::VastAi] {
            let scanned = scan_sold_as(cloud, name);
            assert_eq!(
                identify(cloud, name, None),
                scanned.first().copied(),
                "{name} on {cloud:?}"
            );
        }
        let either: Vec<&GpuModel> = CATALOGUE
            .iter()
            .filter(|m| {
                let wanted = normalize(name);
                m.runpod
                    .iter()
                    .chain(m.vastai)
                    .any(|own| normalizes_to(own, &wanted))
            })
            .collect();
        let expected = scan_by_name(name).map_or(either, |model| vec![model]);
        assert_eq!(resolve(name), expected, "{name}");
    }
}

/// `is_known` answers as `resolve` does, for every name either cloud or the catalogue uses,
/// their other spellings, and names nobody uses.
#[test]
fn is_known_agrees_with_resolve() {
    let mut names: Vec<String> = Vec::new();
    for model in CATALOGUE {
        names.push(model.name.to_owned());
        names.extend(model.runpod.iter().map(|n| (*n).to_owned()));
        names.extend(model.vastai.iter().map(|n| (*n).to_owned()));
    }
    let spelled: Vec<String> = names
        .iter()
        .flat_map(|n| [n.to_lowercase(), n.replace(' ', "_"), format!(" {n} ")])
        .collect();
    names.extend(spelled);
    names.extend(["", "H1OO", "NVIDIA", "RTX 9999", "a100 sxm4 80"].map(str::to_owned));
    for name in &names {
        assert_eq!(is_known(name), !resolve(name).is_empty(), "{name:?}");
    }
    assert!(is_known("NVIDIA RTX A6000") && !is_known("RTX 9999"));
}

/// The ASCII path of `normalize` drops and folds exactly what the Unicode one does.
#[test]
fn normalize_reads_ascii_as_the_unicode_rules_do() {
    let by_chars = |name: &str| -> String {
        name.chars()
            .filter(|c| !c.is_whitespace() && *c != '_')
            .flat_map(char::to_lowercase)
            .collect()
    };
    for byte in 0u8..128 {
        let name = format!("RTX{}A_6000 x", char::from(byte));
        assert_eq!(normalize(&name), by_chars(&name), "byte {byte:#x}");
    }
    assert_eq!(
        normalize("NVIDIA  RTX\u{a0}A6000"),
        by_chars("NVIDIA  RTX\u{a0}A6000")
    );
    assert_eq!(normalize("Ä100"), "ä100");
}
