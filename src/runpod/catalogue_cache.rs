//! The catalogue, cached and refreshed on a timer: placement reads it on every create, and
//! reading it from RunPod each time would spend the rate-limit quota on data that changes
//! slowly (and predicts little: stock is not a reservation, api-notes P2).

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::catalogue::Catalogue;
use super::client::RunPodClient;
use super::error::ApiError;

/// One successful read of the catalogue.
#[derive(Debug)]
pub struct CachedCatalogue {
    pub catalogue: Catalogue,
    pub fetched_at: Instant,
}

/// The last good catalogue; a failed refresh keeps it.
#[derive(Debug, Default)]
pub struct CatalogueCache {
    current: ArcSwapOption<CachedCatalogue>,
}

impl CatalogueCache {
    pub fn new() -> Arc<CatalogueCache> {
        Arc::new(CatalogueCache::default())
    }

    /// The last good catalogue, if one was ever read.
    pub fn get(&self) -> Option<Arc<CachedCatalogue>> {
        self.current.load_full()
    }

    /// Reads the catalogue now; on failure the previous one stays.
    pub async fn refresh(&self, client: &RunPodClient) -> Result<(), ApiError> {
        let catalogue = client.catalogue().await?;
        debug!(
            secure = catalogue.secure.len(),
            community = catalogue.community.len(),
            data_centers = catalogue.data_centers.len(),
            "catalogue refreshed"
        );
        self.current.store(Some(Arc::new(CachedCatalogue {
            catalogue,
            fetched_at: Instant::now(),
        })));
        Ok(())
    }

    /// Refreshes now and then every `interval`; after a failure, retries after a quarter of it.
    pub fn spawn_refresher(
        self: &Arc<Self>,
        client: RunPodClient,
        interval: Duration,
    ) -> JoinHandle<()> {
        let cache = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let wait = match cache.refresh(&client).await {
                    Ok(()) => interval,
                    Err(error) => {
                        warn!(error = %error, "catalogue refresh failed; keeping the last one");
                        interval / 4
                    }
                };
                tokio::time::sleep(wait.max(Duration::from_millis(100))).await;
            }
        })
    }
}
