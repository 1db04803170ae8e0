//! The default catalogue: real GPU ids (api-notes 4.1), plausible list prices (4.4) and data
//! centres with mixed stock, including a GPU with no stock somewhere (NONE) and GPUs that are
//! not offered on Community Cloud.

use std::collections::BTreeMap;

use crate::scenario::{
    Availability, CpuFlavorSpec, DataCenterSpec, GpuPrice, GpuSpec, Manufacturer, MaxCount, Region,
    TemplateSpec,
};

pub(crate) const RTX_4090: &str = "NVIDIA GeForce RTX 4090";
pub(crate) const RTX_A4000: &str = "NVIDIA RTX A4000";
pub(crate) const RTX_A6000: &str = "NVIDIA RTX A6000";
pub(crate) const RTX_4000_ADA: &str = "NVIDIA RTX 4000 Ada Generation";
pub(crate) const L40S: &str = "NVIDIA L40S";
pub(crate) const A100: &str = "NVIDIA A100 80GB PCIe";
pub(crate) const H100: &str = "NVIDIA H100 80GB HBM3";
pub(crate) const H200: &str = "NVIDIA H200";
pub(crate) const MI300X: &str = "AMD Instinct MI300X OAM";

#[allow(clippy::too_many_arguments)]
fn gpu(
    id: &str,
    name: &str,
    memory: u32,
    (secure, community): (f64, f64),
    serverless: Option<f64>,
    (max_secure, max_community): (u32, u32),
    pool: Option<&str>,
) -> GpuSpec {
    GpuSpec {
        id: id.to_owned(),
        name: name.to_owned(),
        memory,
        manufacturer: Manufacturer::Nvidia,
        secure: max_secure > 0,
        community: max_community > 0,
        price: GpuPrice {
            secure,
            community,
            serverless,
        },
        max_count: MaxCount {
            secure: max_secure,
            community: max_community,
        },
        pool: pool.map(str::to_owned),
        cuda_versions: ["12.4", "12.6", "12.8"].map(str::to_owned).to_vec(),
    }
}

pub(crate) fn gpus() -> Vec<GpuSpec> {
    let mut mi300x = gpu(MI300X, "MI300X", 192, (2.49, 0.0), None, (8, 0), None);
    mi300x.manufacturer = Manufacturer::Amd;
    mi300x.cuda_versions = Vec::new();
    vec![
        gpu(
            RTX_A4000,
            "RTX A4000",
            16,
            (0.25, 0.17),
            Some(0.58),
            (8, 6),
            Some("AMPERE_16"),
        ),
        gpu(
            RTX_4000_ADA,
            "RTX 4000 Ada",
            20,
            (0.26, 0.20),
            None,
            (8, 6),
            None,
        ),
        gpu(
            RTX_4090,
            "RTX 4090",
            24,
            (0.44, 0.31),
            Some(1.10),
            (8, 4),
            Some("ADA_24"),
        ),
        gpu(
            RTX_A6000,
            "RTX A6000",
            48,
            (0.49, 0.33),
            Some(1.22),
            (8, 8),
            Some("AMPERE_48"),
        ),
        gpu(
            L40S,
            "L40S",
            48,
            (0.86, 0.79),
            Some(1.90),
            (8, 4),
            Some("ADA_48_PRO"),
        ),
        gpu(
            A100,
            "A100 PCIe",
            80,
            (1.64, 1.19),
            Some(2.72),
            (8, 4),
            Some("AMPERE_80"),
        ),
        gpu(
            H100,
            "H100 SXM",
            80,
            (2.99, 2.69),
            Some(4.18),
            (8, 8),
            Some("ADA_80_PRO"),
        ),
        gpu(
            H200,
            "H200 SXM",
            141,
            (3.99, 0.0),
            Some(5.58),
            (8, 0),
            Some("HOPPER_141"),
        ),
        mi300x,
    ]
}

fn stock(entries: &[(&str, Availability)]) -> BTreeMap<String, Availability> {
    entries
        .iter()
        .map(|(id, level)| ((*id).to_owned(), *level))
        .collect()
}

fn cpu_stock(level: Availability) -> BTreeMap<String, Availability> {
    ["cpu3c", "cpu3g", "cpu3m", "cpu5c", "cpu5g", "cpu5m"]
        .into_iter()
        .map(|id| (id.to_owned(), level))
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn dc(
    id: &str,
    name: &str,
    region: Region,
    country: &str,
    compliance: &[&str],
    global_network: bool,
    volumes: &[&str],
    gpus: &[(&str, Availability)],
    cpus: Option<Availability>,
) -> DataCenterSpec {
    DataCenterSpec {
        id: id.to_owned(),
        name: name.to_owned(),
        region,
        country: Some(country.to_owned()),
        compliance: compliance.iter().map(|c| (*c).to_owned()).collect(),
        global_network,
        network_volume_types: volumes.iter().map(|v| (*v).to_owned()).collect(),
        gpu_availability: stock(gpus),
        cpu_availability: cpus.map(cpu_stock).unwrap_or_default(),
    }
}

pub(crate) fn data_centers() -> Vec<DataCenterSpec> {
    use Availability::{High, Low, Medium};
    const NO_STOCK: Availability = Availability::None;
    vec![
        dc(
            "EU-RO-1",
            "Europe (Romania) 1",
            Region::Europe,
            "RO",
            &["GDPR", "ISO_IEC_27001", "SOC_2_TYPE_2"],
            true,
            &["STANDARD"],
            &[
                (RTX_A4000, Medium),
                (RTX_4000_ADA, High),
                (RTX_4090, High),
                (RTX_A6000, Low),
                (L40S, High),
                (A100, Low),
                (H100, NO_STOCK),
            ],
            Some(High),
        ),
        dc(
            "EU-SE-1",
            "Europe (Sweden) 1",
            Region::Europe,
            "SE",
            &["GDPR", "ISO_IEC_27001", "RENEWABLE"],
            true,
            &["STANDARD", "HIGH_PERFORMANCE"],
            &[
                (RTX_4090, Low),
                (RTX_A6000, High),
                (L40S, NO_STOCK),
                (A100, Medium),
                (H100, Low),
            ],
            Some(Medium),
        ),
        dc(
            "EU-CZ-1",
            "Europe (Czech Republic) 1",
            Region::Europe,
            "CZ",
            &["GDPR"],
            true,
            &["STANDARD"],
            &[(RTX_4090, Medium), (RTX_4000_ADA, Medium), (RTX_A4000, Low)],
            None,
        ),
        dc(
            "US-TX-3",
            "United States (Texas) 3",
            Region::NorthAmerica,
            "US",
            &["SOC_2_TYPE_2", "ISO_IEC_27001", "HIPAA"],
            true,
            &["STANDARD", "HIGH_PERFORMANCE"],
            &[
                (RTX_4090, NO_STOCK),
                (L40S, Medium),
                (A100, High),
                (H100, High),
                (H200, Medium),
                (MI300X, Low),
            ],
            Some(High),
        ),
        dc(
            "US-CA-2",
            "United States (California) 2",
            Region::NorthAmerica,
            "US",
            &["SOC_2_TYPE_2"],
            true,
            &["STANDARD"],
            &[
                (RTX_A4000, High),
                (RTX_4000_ADA, Low),
                (RTX_4090, High),
                (RTX_A6000, Medium),
                (H100, Medium),
            ],
            None,
        ),
        dc(
            "US-KS-2",
            "United States (Kansas) 2",
            Region::NorthAmerica,
            "US",
            &["SOC_2_TYPE_2"],
            true,
            &["STANDARD"],
            &[(RTX_A4000, Low), (RTX_A6000, Low), (L40S, Low), (H200, Low)],
            Some(Low),
        ),
        dc(
            "OC-AU-1",
            "Oceania (Australia) 1",
            Region::Oceania,
            "AU",
            &[],
            true,
            &[],
            &[(RTX_4090, Low), (RTX_A4000, Medium)],
            None,
        ),
    ]
}

pub(crate) fn cpu_flavors() -> Vec<CpuFlavorSpec> {
    let flavor = |id: &str, name: &str, ram: u32, price: f64| CpuFlavorSpec {
        id: id.to_owned(),
        name: name.to_owned(),
        ram_gb_per_vcpu: ram,
        price_per_vcpu: price,
        max_vcpu: 32,
    };
    vec![
        flavor("cpu3c", "Compute-Optimized (Gen 3)", 2, 0.02),
        flavor("cpu3g", "General Purpose (Gen 3)", 4, 0.03),
        flavor("cpu3m", "Memory-Optimized (Gen 3)", 8, 0.04),
        flavor("cpu5c", "Compute-Optimized (Gen 5)", 2, 0.03),
        flavor("cpu5g", "General Purpose (Gen 5)", 4, 0.04),
        flavor("cpu5m", "Memory-Optimized (Gen 5)", 8, 0.05),
    ]
}

pub(crate) fn templates() -> Vec<TemplateSpec> {
    vec![TemplateSpec {
        id: "runpod-torch-v240".to_owned(),
        image: "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04".to_owned(),
        args: None,
        disk: Some(50),
        ports: Some(vec!["8888/http".to_owned(), "22/tcp".to_owned()]),
        env: BTreeMap::new(),
    }]
}
