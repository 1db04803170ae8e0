//! The GPU and data-centre catalogue: includes, filters and their 400/422s.

use runpod_simulator::scenario::Scenario;
use serde_json::{Value, json};

use crate::support::{Api, RTX_4090};

fn ids(list: &Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|g| g["id"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn gpu_list_without_include_has_prices_but_no_availability() {
    let api = Api::start(Scenario::default()).await;
    let list = api.get("/v2/catalog/gpus").await;
    assert_eq!(list.status, 200);
    let gpus = list.body["gpus"].as_array().unwrap();
    assert!(gpus.len() >= 8);
    let rtx = gpus.iter().find(|g| g["id"] == RTX_4090).unwrap();
    assert_eq!(rtx["memory"], 24);
    assert_eq!(
        rtx["price"],
        json!({"secure": 0.44, "community": 0.31, "serverless": 1.1})
    );
    assert_eq!(rtx["maxCount"], json!({"secure": 8, "community": 4}));
    assert!(
        gpus.iter()
            .all(|g| g.get("availability").is_none() && g.get("dataCenters").is_none())
    );
    assert!(gpus.iter().any(|g| g["community"] == false));

    for query in [
        "count=2",
        "cloud=SECURE",
        "product=POD",
        "countryCodes=FR",
        "cudaVersions=12.8",
        "minCudaVersion=12",
    ] {
        let resp = api.get(&format!("/v2/catalog/gpus?{query}")).await;
        assert_eq!(resp.status, 400, "{query} needs include");
        assert!(
            resp.detail().contains("include=AVAILABILITY"),
            "{}",
            resp.detail()
        );
    }
    let no_product = api.get("/v2/catalog/gpus?include=AVAILABILITY").await;
    assert_eq!(no_product.status, 400);
    assert!(no_product.detail().contains("product"));
    api.assert_contract();
}

#[tokio::test]
async fn availability_and_filters() {
    let api = Api::start(Scenario::default()).await;
    let base = "/v2/catalog/gpus?include=AVAILABILITY&product=POD";
    let all = api.get(base).await;
    assert_eq!(all.status, 200);
    let h100 = all.body["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["id"] == "NVIDIA H100 80GB HBM3")
        .unwrap();
    assert_eq!(h100["availability"], "HIGH");
    let per_dc: Vec<(&str, &str)> = h100["dataCenters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["id"].as_str().unwrap(),
                d["availability"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(
        per_dc.contains(&("EU-RO-1", "NONE")) && per_dc.contains(&("US-TX-3", "HIGH")),
        "{per_dc:?}"
    );
    assert!(
        h100["cudaVersions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["version"] == "12.8")
    );

    // `cloud` picks whose stock is reported; it does not narrow the list. H200 is not offered
    // on Community Cloud: still listed, with no stock there.
    let community = api.get(&format!("{base}&cloud=COMMUNITY")).await;
    let gpus = community.body["gpus"].as_array().unwrap();
    let h200 = gpus.iter().find(|g| g["id"] == "NVIDIA H200").unwrap();
    assert_eq!(h200["community"], false);
    assert_eq!(h200["availability"], "NONE");
    let rtx = gpus.iter().find(|g| g["id"] == RTX_4090).unwrap();
    assert_ne!(rtx["availability"], "NONE");

    let australia = api.get(&format!("{base}&countryCodes=AU")).await;
    let au_ids = ids(&australia.body["gpus"]);
    assert_eq!(au_ids.len(), 2, "{au_ids:?}");
    let au_rtx = australia.body["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["id"] == RTX_4090)
        .unwrap();
    assert_eq!(ids(&au_rtx["dataCenters"]), ["OC-AU-1"]);

    let too_many = api.get(&format!("{base}&count=9")).await;
    assert!(
        too_many.body["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["availability"] == "NONE")
    );

    let exact = api.get(&format!("{base}&cudaVersions=12.6")).await;
    let rtx = exact.body["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["id"] == RTX_4090)
        .unwrap();
    assert_eq!(
        rtx["cudaVersions"],
        json!([{"version": "12.6", "available": true}])
    );
    let amd = exact.body["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["manufacturer"] == "AMD")
        .unwrap();
    assert_eq!(amd["availability"], "NONE");
    assert!(amd.get("cudaVersions").is_none());

    assert_eq!(
        api.get(&format!("{base}&cudaVersions=12.8&minCudaVersion=12"))
            .await
            .status,
        400
    );
    for bad in [
        "cudaVersions=12",
        "minCudaVersion=twelve",
        "countryCodes=fr",
        "cloud=ALL",
        "count=0",
        "product=GAME",
    ] {
        assert_eq!(api.get(&format!("{base}&{bad}")).await.status, 422, "{bad}");
    }
    assert_eq!(
        api.get("/v2/catalog/gpus?include=AVAILABILITY,AVAILABILITY&product=POD")
            .await
            .status,
        422
    );
    api.assert_contract();
}

#[tokio::test]
async fn single_gpu_and_data_centre_lookups() {
    let api = Api::start(Scenario::default()).await;
    let one = api
        .get("/v2/catalog/gpus/NVIDIA%20GeForce%20RTX%204090")
        .await;
    assert_eq!((one.status, one.body["id"].as_str()), (200, Some(RTX_4090)));
    let with = api
        .get("/v2/catalog/gpus/NVIDIA%20H200?include=AVAILABILITY&product=POD&cloud=COMMUNITY")
        .await;
    assert_eq!(
        (with.status, with.body["availability"].as_str()),
        (200, Some("NONE"))
    );
    assert!(with.body.get("dataCenters").is_none());
    assert_eq!(api.get("/v2/catalog/gpus/RTX%204090").await.status, 404);

    let dcs = api.get("/v2/catalog/datacenters").await;
    let all = ids(&dcs.body["dataCenters"]);
    for wanted in ["EU-RO-1", "US-TX-3", "US-CA-2", "EU-SE-1"] {
        assert!(all.contains(&wanted), "{all:?}");
    }
    assert!(dcs.body["dataCenters"][0].get("gpuAvailability").is_none());
    let europe = api
        .get("/v2/catalog/datacenters?regions=EUROPE&include=GPU_AVAILABILITY")
        .await;
    let eu = europe.body["dataCenters"].as_array().unwrap();
    assert!(eu.iter().all(|d| d["region"] == "EUROPE") && eu.len() == 3);
    let ro = eu.iter().find(|d| d["id"] == "EU-RO-1").unwrap();
    assert!(
        ro["gpuAvailability"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["id"] == "NVIDIA H100 80GB HBM3" && g["availability"] == "NONE")
    );
    let both = api
        .get(
            "/v2/catalog/datacenters?compliance=GDPR,RENEWABLE&networkVolumeTypes=HIGH_PERFORMANCE",
        )
        .await;
    assert_eq!(ids(&both.body["dataCenters"]), ["EU-SE-1"]);
    assert_eq!(
        api.get("/v2/catalog/datacenters?regions=MARS").await.status,
        422
    );
    assert_eq!(
        api.get("/v2/catalog/datacenters?globalNetwork=maybe")
            .await
            .status,
        422
    );
    let single = api
        .get("/v2/catalog/datacenters/US-CA-2?include=GPU_AVAILABILITY,CPU_AVAILABILITY")
        .await;
    assert_eq!(
        (single.status, single.body["id"].as_str()),
        (200, Some("US-CA-2"))
    );
    assert!(single.body["gpuAvailability"].is_array());
    assert_eq!(api.get("/v2/catalog/datacenters/US-NJ-1").await.status, 404);
    api.assert_contract();
}
