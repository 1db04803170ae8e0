//! The `cheapest` decision: among the clouds a pod may use, the one whose published price of a
//! GPU type that fits the pod is lowest, or a refusal naming each cloud's cheapest fit.

use super::{Fit, Fits};
use crate::provider::{Cloud, PROVIDER};

/// One cloud's side of a `cheapest` comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Side {
    pub cloud: Cloud,
    /// The cheapest fitting GPU types; `None` when no node of this cloud has published prices.
    pub fits: Option<Fits>,
    /// The pod's cap on this cloud, USD per hour (for messages).
    pub cap: Option<f64>,
}

/// What `cheapest` decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Cheapest {
    /// Go to `cloud`; `warning` says why and names the prices, `record` is the annotation value.
    Chose {
        cloud: Cloud,
        warning: String,
        record: String,
    },
    /// Every cloud published prices and none has a GPU that fits the pod within its cap.
    Refused(String),
}

/// The cloud a `runpod.io/cheapest-choice` record names (`chose Vast.ai: ...`), when it is one.
pub fn recorded_choice(record: &str) -> Option<Cloud> {
    let named = record.strip_prefix("chose ")?.split_once(':')?.0;
    Cloud::ALL
        .into_iter()
        .find(|cloud| cloud.display_name() == named)
}

/// The cloud `cheapest` picks among the clouds the pod may use (`sides`, in preference order
/// for ties): the lowest published price of a GPU type that fits the pod within its cap. When
/// nothing fits where prices are published but some cloud has published none yet, that cloud
/// (the first of them) is chosen with a warning; with nothing published at all, `fallback`.
pub fn cheapest(sides: &[Side], fallback: Cloud) -> Cheapest {
    let price = |fit: &Fit| format!("{} at {:.3} USD/h", fit.gpu, fit.per_hour);
    let describe = |side: &Side| -> String {
        let name = side.cloud.display_name();
        match &side.fits {
            None => format!("{name} has published no prices yet"),
            Some(Fits {
                within_cap: Some(fit),
                ..
            }) => format!("{name} {}", price(fit)),
            Some(Fits {
                cheapest: Some(fit),
                ..
            }) => format!(
                "{name}'s cheapest fit {} is above the cap of {}",
                price(fit),
                side.cap
                    .map_or_else(|| "none".to_owned(), |cap| format!("{cap:.3} USD/h"))
            ),
            Some(_) => format!("{name} sells no GPU that fits this pod now"),
        }
    };
    let listed = |sides: &[Side]| sides.iter().map(describe).collect::<Vec<_>>().join("; ");
    let best = sides
        .iter()
        .filter_map(|side| {
            let fit = side.fits.as_ref()?.within_cap.as_ref()?;
            Some((side.cloud, fit.per_hour))
        })
        .fold(None::<(Cloud, f64)>, |best, (cloud, per_hour)| match best {
            Some((_, lowest)) if lowest <= per_hour => best,
            _ => Some((cloud, per_hour)),
        });
    let chose = |cloud: Cloud, why: &str| {
        let others = listed(sides);
        Cheapest::Chose {
            cloud,
            warning: format!(
                "runpod-kubelet: {PROVIDER}=cheapest chose {}{why} ({others})",
                cloud.display_name()
            ),
            record: format!("chose {}: {others}", cloud.display_name()),
        }
    };
    if let Some((cloud, _)) = best {
        return chose(
            cloud,
            ", the lowest published price of a GPU that fits the pod",
        );
    }
    if sides.iter().all(|side| side.fits.is_none()) {
        let cloud = sides.first().map_or(fallback, |side| side.cloud);
        return chose(
            cloud,
            ": no virtual node has published prices yet, so nothing was compared",
        );
    }
    if let Some(unpublished) = sides.iter().find(|side| side.fits.is_none()) {
        return chose(
            unpublished.cloud,
            ": nothing fits where prices are published, and this cloud has not published its \
             prices yet",
        );
    }
    Cheapest::Refused(format!(
        "{PROVIDER} is cheapest but no cloud sells a GPU that fits this pod within its price cap: \
         {}; raise the cap, allow more GPU types, or wait for capacity",
        listed(sides)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpus::{GpuPrices, Need};

    #[test]
    fn cheapest_picks_the_lowest_price_of_a_gpu_that_fits() {
        // The H100 pod goes where the H100 is cheaper, although the other cloud sells a far
        // cheaper small GPU (which does not fit).
        let runpod = GpuPrices::parse("H100x1-8:SECURE=2.99,RTXA4000x1-8:SECURE=0.25");
        let vast = GpuPrices::parse("H100x1=2.10,H100x2=2.05,RTX4090x1=0.12,storage=0.0002");
        let need = |types: &[&str], class: Option<&str>| Need {
            gpu_types: types.iter().map(|t| (*t).to_owned()).collect(),
            gpu_count: 1,
            class: class.map(str::to_owned),
            disk_gb: 20,
            ..Need::default()
        };
        let sides = |types: &[&str], cap: Option<f64>| {
            vec![
                Side {
                    cloud: Cloud::RunPod,
                    fits: Some(runpod.cheapest_fit(&need(types, Some("SECURE")), cap)),
                    cap,
                },
                Side {
                    cloud: Cloud::VastAi,
                    fits: Some(vast.cheapest_fit(&need(types, None), cap)),
                    cap,
                },
            ]
        };
        let Cheapest::Chose {
            cloud,
            warning,
            record,
        } = cheapest(&sides(&["H100"], None), Cloud::RunPod)
        else {
            panic!("refused")
        };
        assert_eq!(cloud, Cloud::VastAi);
        assert!(warning.contains("cheapest chose Vast.ai"), "{warning}");
        assert!(
            warning.contains("RunPod H100 at 2.990 USD/h")
                && warning.contains("Vast.ai H100 at 2.104 USD/h"),
            "both prices, disk included: {warning}"
        );
        assert!(record.starts_with("chose Vast.ai"), "{record}");
        assert_eq!(recorded_choice(&record), Some(Cloud::VastAi));
        assert_eq!(recorded_choice("chose AWS: cheap"), None);
        assert_eq!(recorded_choice("free GPUs"), None);
        // Any small GPU: RunPod's RTX A4000 against Vast.ai's RTX 4090.
        let Cheapest::Chose { cloud, .. } = cheapest(&sides(&[], None), Cloud::RunPod) else {
            panic!("refused")
        };
        assert_eq!(cloud, Cloud::VastAi);
        let Cheapest::Chose { cloud, .. } = cheapest(&sides(&["RTXA4000"], None), Cloud::RunPod)
        else {
            panic!("refused")
        };
        assert_eq!(cloud, Cloud::RunPod, "a type only RunPod sells goes there");
        // Under every cap: refused, naming the cheapest fit per cloud.
        let Cheapest::Refused(message) = cheapest(&sides(&["H100"], Some(1.0)), Cloud::RunPod)
        else {
            panic!("admitted")
        };
        assert!(
            message.contains(
                "RunPod's cheapest fit H100 at 2.990 USD/h is above the cap of 1.000 USD/h"
            ) && message.contains("Vast.ai's cheapest fit H100 at 2.104 USD/h"),
            "{message}"
        );
        // A cloud that has not published yet gets the pod, with a warning saying so.
        let mut partial = sides(&["B200"], None);
        partial[1].fits = None;
        let Cheapest::Chose { cloud, warning, .. } = cheapest(&partial, Cloud::RunPod) else {
            panic!("refused")
        };
        assert_eq!(cloud, Cloud::VastAi);
        assert!(
            warning.contains("Vast.ai has published no prices yet")
                && warning.contains("RunPod sells no GPU that fits"),
            "{warning}"
        );
        let mut none = sides(&[], None);
        none.iter_mut().for_each(|side| side.fits = None);
        let Cheapest::Chose { cloud, warning, .. } = cheapest(&none, Cloud::RunPod) else {
            panic!("refused")
        };
        assert_eq!(cloud, Cloud::RunPod);
        assert!(warning.contains("no virtual node"), "{warning}");
        // Equal prices: the first side (the installation's order) wins.
        let tie = GpuPrices::parse("L4x1-8:SECURE=0.4");
        let same = GpuPrices::parse("L4x1=0.4");
        let fits = |prices: &GpuPrices, class: Option<&str>| {
            Some(prices.cheapest_fit(&need(&["L4"], class), None))
        };
        let mut vast_free = same.clone();
        vast_free.storage_per_gb_hour = None;
        let tied = [
            Side {
                cloud: Cloud::RunPod,
                fits: fits(&tie, Some("SECURE")),
                cap: None,
            },
            Side {
                cloud: Cloud::VastAi,
                fits: fits(&vast_free, None),
                cap: None,
            },
        ];
        assert!(matches!(
            cheapest(&tied, Cloud::VastAi),
            Cheapest::Chose {
                cloud: Cloud::RunPod,
                ..
            }
        ));
    }
}
