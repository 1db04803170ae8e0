//! Pods that mount PersistentVolumeClaims: a claim of this project's StorageClass makes the pod
//! a RunPod pod pinned to the virtual node (its PV is the virtual node's alone); any other
//! claim, or more than one, keeps the pod local (fallback) or refuses it (always).

use super::*;

fn with_claims(claims: &[&str]) -> Value {
    let volumes: Vec<Value> = claims
        .iter()
        .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    let mounts: Vec<Value> = claims
        .iter()
        .map(|c| json!({"name": c, "mountPath": format!("/{c}")}))
        .collect();
    let mut pod = with(gpu_pod(), "/spec/volumes", Value::Array(volumes));
    pod["spec"]["containers"][0]["volumeMounts"] = Value::Array(mounts);
    pod["spec"]["containers"][0]["command"] = json!(["python", "train.py"]);
    pod
}

fn context_with(claims: &[(&str, &str)]) -> Context {
    let mut context = labelled_namespace();
    context.claim_provisioners = claims
        .iter()
        .map(|(c, p)| ((*c).to_owned(), (*p).to_owned()))
        .collect();
    context
}

#[test]
fn a_network_volume_claim_pins_the_pod_to_the_virtual_node_with_a_warning() {
    let context = context_with(&[("data", runpod_contract::volumes::PROVISIONER)]);
    let (verdict, patched) = admit(&with_claims(&["data"]), &context);
    assert_bursts(&verdict);
    let Verdict::Allow { warnings, .. } = &verdict else {
        unreachable!()
    };
    assert!(
        warnings.iter().any(|w| w.contains("never falls back")),
        "{warnings:?}"
    );
    assert_eq!(
        patched["spec"]["nodeSelector"]["type"], "virtual-kubelet",
        "pinned, not preferred: {patched}"
    );
    assert_idempotent(&patched, &context);
}

#[test]
fn other_claims_stay_local_or_are_refused() {
    // Another class's claim: a fallback pod stays local, with the reason.
    let context = context_with(&[("data", "ebs.csi.aws.com")]);
    let (verdict, patched) = admit(&with_claims(&["data"]), &context);
    let Verdict::Allow {
        warnings,
        untouched,
        ..
    } = &verdict
    else {
        panic!("{verdict:?}");
    };
    assert_eq!(*untouched, Some(Untouched::CannotBurst));
    assert!(
        warnings.iter().any(|w| w.contains("ebs.csi.aws.com")),
        "{warnings:?}"
    );
    assert!(patched["spec"].get("tolerations").is_none());
    // A claim that does not exist, under `always`: refused, naming it.
    let always = annotate(with_claims(&["missing"]), contract::BURST_MODE, "always");
    let (verdict, _) = admit(&always, &context_with(&[]));
    let (code, message) = denial(&verdict);
    assert_eq!(code, 422);
    assert!(message.contains("\"missing\""), "{message}");
    // Two network volumes: one is all a RunPod pod mounts.
    let ours = runpod_contract::volumes::PROVISIONER;
    let two = annotate(with_claims(&["a", "b"]), contract::BURST_MODE, "always");
    let (verdict, _) = admit(&two, &context_with(&[("a", ours), ("b", ours)]));
    let (_, message) = denial(&verdict);
    assert!(message.contains("at most one"), "{message}");
}

/// Issue 46: a network volume is in one datacenter, so its pod runs there or nowhere; a pod
/// whose volume is where the installation or the pod itself forbids is refused, naming both.
#[test]
fn a_volume_outside_the_allowed_datacenters_is_refused() {
    let ours = runpod_contract::volumes::PROVISIONER;
    let mut context = context_with(&[("data", ours)]);
    // The installation allows EU-RO-1 and US-TX-3 (`config()`).
    context
        .claim_datacenters
        .insert("data".into(), "EU-SE-1".into());
    let (verdict, _) = admit(&with_claims(&["data"]), &context);
    let (code, message) = denial(&verdict);
    assert_eq!(code, 403);
    assert!(message.contains("EU-SE-1"), "{message}");
    assert!(message.contains("EU-RO-1, US-TX-3"), "{message}");

    // In an allowed datacenter: admitted.
    context
        .claim_datacenters
        .insert("data".into(), "US-TX-3".into());
    let (verdict, _) = admit(&with_claims(&["data"]), &context);
    assert_bursts(&verdict);

    // The pod narrows the installation's list and leaves the volume out: refused.
    let narrowed = annotate(with_claims(&["data"]), contract::DATACENTER_IDS, "EU-RO-1");
    let (verdict, _) = admit(&narrowed, &context);
    let (code, message) = denial(&verdict);
    assert_eq!(code, 403);
    assert!(
        message.contains("US-TX-3") && message.contains(contract::DATACENTER_IDS),
        "{message}"
    );

    // Community Cloud cannot attach a network volume.
    let community = annotate(with_claims(&["data"]), contract::CLOUD_TYPE, "COMMUNITY");
    let (verdict, _) = admit(&community, &context);
    let (_, message) = denial(&verdict);
    assert!(message.contains("Secure Cloud"), "{message}");

    // A claim not provisioned yet (no datacenter known) is judged when its first pod lands.
    context.claim_datacenters.clear();
    let (verdict, _) = admit(&with_claims(&["data"]), &context);
    assert_bursts(&verdict);
}

/// Issue 46: the pod runs where its volume is or nowhere, so a price cap no GPU offered there
/// meets is refused at admission, naming what is there and at what price.
#[test]
fn a_volume_where_no_gpu_fits_the_cap_is_refused_naming_what_is_there() {
    let ours = runpod_contract::volumes::PROVISIONER;
    let mut context = context_with(&[("data", ours)]);
    context
        .claim_datacenters
        .insert("data".into(), "US-TX-3".into());
    context.gpu_prices = [(
        runpod_contract::provider::Cloud::RunPod,
        runpod_contract::gpus::GpuPrices::parse(
            "H100x1-8:SECURE=2.99,L40Sx1-8:SECURE=0.45,RTX4090x1-8:SECURE=0.34",
        ),
    )]
    .into();
    context.datacenter_gpus =
        runpod_contract::volumes::parse_datacenter_gpus("US-TX-3=H100|L40S,EU-RO-1=RTX4090");
    // A cap of 0.4 USD/h: the RTX 4090 would do, but it is not offered in US-TX-3.
    let capped = annotate(with_claims(&["data"]), contract::MAX_PRICE, "0.4");
    let (verdict, _) = admit(&capped, &context);
    let (code, message) = denial(&verdict);
    assert_eq!(code, 403);
    assert!(
        message.contains("US-TX-3")
            && message.contains("L40S at 0.450")
            && message.contains("H100 at 2.990")
            && !message.contains("RTX4090"),
        "{message}"
    );
    // A cap the L40S meets: admitted.
    let enough = annotate(with_claims(&["data"]), contract::MAX_PRICE, "0.5");
    let (verdict, _) = admit(&enough, &context);
    assert_bursts(&verdict);
    // Nothing published for the datacenter: judged when the pod is created.
    context.datacenter_gpus.clear();
    let (verdict, _) = admit(&capped, &context);
    assert_bursts(&verdict);
}
