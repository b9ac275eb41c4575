//! The publisher: a task of the daemon that keeps the child provider's inventory in step
//! with the pool. It never blocks the pool or a lease: it reads the pool's status, and
//! whatever Placement answers (or does not), the daemon serves as before.
//!
//! Each turn (at most every `min_interval`): read the pool's warm, leased and target bytes
//! per page size; when the inventory they give differs from what Placement holds, or a
//! refresh is due, write it. The write carries the provider's generation from the last
//! exchange, so any change Placement saw meanwhile (a VM's allocation, another writer) makes
//! it fail with 409 `placement.concurrent_update`: the publisher then re-reads the usage and
//! generation and writes again, up to [`CONFLICT_RETRIES`] times. Any other 409 (such as
//! `placement.inventory.inuse`, allocations on a class the write would remove) is reported,
//! not retried. Failures back off from 1 s to [`MAX_BACKOFF`], each with
//! one log line that says what failed and when the next attempt is.
//!
//! While the pool has adaptive targets, the usage is read as the allocations per consumer
//! (`consumers`), at least every [`KNOWN_DEMAND_EVERY`], and each reading goes to the pool
//! as the consumers' sizes ([`Pool::set_placement_consumers`]: the known demand).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::client::{Client, InventoryWrite, Usage};
use super::config::PlacementConfig;
use super::consumers::Allocations;
use super::error::PlacementError;
use super::inventory::{self, class_name, Figures, Inventory};
use super::status::{Published, State, Status};
use crate::pool::{Pool, PoolStatus};
use crate::PageSize;

/// Re-reads after a generation conflict before the update counts as failed.
pub const CONFLICT_RETRIES: u32 = 3;
/// The longest wait between failed attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How often the allocations are read while the pool has adaptive targets: Placement's
/// consumers that appeared lately and have not leased are their known demand
/// (`pool::adaptive`), VMs that start within seconds. One `GET .../allocations` per host
/// every 5 s.
pub const KNOWN_DEMAND_EVERY: Duration = Duration::from_secs(5);

/// Exponential backoff: 1 s, 2 s, 4 s ... up to [`MAX_BACKOFF`]; a success resets it.
#[derive(Debug, Clone, Default)]
pub struct Backoff {
    failures: u32,
    until: Option<Instant>,
}

impl Backoff {
    /// Records a failure at `now`; returns the wait before the next attempt.
    pub fn fail(&mut self, now: Instant) -> Duration {
        let wait = Duration::from_secs(1 << self.failures.min(6)).min(MAX_BACKOFF);
        self.failures += 1;
        self.until = Some(now + wait);
        wait
    }

    /// Records a success; returns how many failures came before it.
    pub fn succeed(&mut self) -> u32 {
        self.until = None;
        std::mem::take(&mut self.failures)
    }

    /// Whether an attempt at `now` must wait.
    pub fn waiting(&self, now: Instant) -> bool {
        self.until.is_some_and(|u| now < u)
    }
}

/// The running publisher.
#[derive(Debug)]
pub struct Publisher {
    /// What it last did.
    pub status: Arc<Status>,
    stop: watch::Sender<bool>,
}

impl Publisher {
    /// Stops it after the exchange in flight, if any.
    pub fn stop(&self) {
        // Fails only when the publisher's task has ended already: it is stopped.
        let _ = self.stop.send(true);
    }
}

/// Starts publishing `pool` per `config` (on the current tokio runtime).
pub fn spawn(pool: Arc<Pool>, config: PlacementConfig) -> Publisher {
    let status = Arc::new(Status::default());
    let (stop, stopped) = watch::channel(false);
    tracing::info!(
        compute_node = %config.compute_node,
        endpoint = config.endpoint.as_deref().unwrap_or("(Keystone catalog)"),
        "publishing warm capacity to OpenStack Placement"
    );
    tokio::spawn(run(pool, config, Arc::clone(&status), stopped));
    Publisher { status, stop }
}

/// Warm, leased and target bytes per page size, summed over the nodes, and the largest
/// node's warm bytes.
pub fn figures(status: &PoolStatus) -> BTreeMap<PageSize, Figures> {
    let mut out: BTreeMap<PageSize, Figures> = BTreeMap::new();
    for k in &status.kinds {
        let f = out.entry(k.page_size).or_default();
        f.warm += k.warm_bytes;
        f.leased += k.leased_bytes;
        f.target += k.target_bytes;
        f.largest_node_warm = f.largest_node_warm.max(k.warm_bytes);
    }
    out
}

/// What the publisher knows of Placement between turns.
struct Session {
    client: Client,
    config: PlacementConfig,
    /// The child provider's uuid, once found or made.
    child: Option<String>,
    /// Usage and generation from the last exchange.
    usage: Option<Usage>,
    /// What Placement holds, as last written.
    published: Option<BTreeMap<String, Inventory>>,
    last_refresh: Option<Instant>,
    /// When the usage was last read.
    last_usage: Option<Instant>,
    /// The allocations per consumer last read, until the pool has them.
    fresh: Option<Allocations>,
}

impl Session {
    fn child_name(&self) -> String {
        format!("{}:hugeprep", self.config.compute_node)
    }

    /// Finds the compute node's provider, then finds or makes the child and the classes.
    async fn setup(&mut self, classes: &[String]) -> Result<String, PlacementError> {
        for class in classes {
            self.client.ensure_class(class).await?;
        }
        let name = self.config.compute_node.clone();
        let compute = self
            .client
            .provider_by_name(&name)
            .await?
            .ok_or(PlacementError::NoComputeNode { name })?;
        let child_name = self.child_name();
        let child = match self.client.provider_by_name(&child_name).await? {
            Some(c) => c,
            None => {
                let c = self
                    .client
                    .create_provider(&child_name, &compute.uuid)
                    .await?;
                tracing::info!(provider = %c.uuid, name = %child_name, parent = %compute.uuid, "Placement: created the warm-memory provider");
                c
            }
        };
        if child.parent.as_deref() != Some(compute.uuid.as_str()) {
            return Err(PlacementError::WrongParent {
                name: child_name,
                parent: child.parent.unwrap_or_else(|| "none".into()),
                compute_node: compute.uuid,
            });
        }
        Ok(child.uuid)
    }

    /// One update; `Ok(Some(..))` when it wrote, `Ok(None)` when nothing needed writing.
    /// With `demand` (the pool has adaptive targets) the usage is read as the allocations
    /// per consumer, at least every [`KNOWN_DEMAND_EVERY`].
    async fn update(
        &mut self,
        figures: &BTreeMap<PageSize, Figures>,
        status: &Status,
        demand: bool,
    ) -> Result<Option<Vec<Published>>, PlacementError> {
        let now = Instant::now();
        let refresh = self
            .last_refresh
            .map_or(true, |t| now.duration_since(t) >= self.config.refresh);
        let usage_due = demand
            && self
                .last_usage
                .map_or(true, |t| now.duration_since(t) >= KNOWN_DEMAND_EVERY);
        let child = match &self.child {
            Some(c) => c.clone(),
            None => {
                let classes: Vec<String> = figures.keys().map(|ps| class_name(*ps)).collect();
                let c = self.setup(&classes).await?;
                self.child = Some(c.clone());
                self.usage = None;
                c
            }
        };
        if refresh || self.usage.is_none() {
            self.read_usage(&child, demand).await?;
            self.last_refresh = Some(now);
        } else if usage_due {
            self.read_usage(&child, demand).await?;
        }
        let mut conflicts = 0;
        loop {
            let usage = self.usage.clone().unwrap_or_default();
            let wanted = inventory::inventories(figures, &usage.used);
            if !refresh && self.published.as_ref() == Some(&wanted) {
                return Ok(None);
            }
            match self
                .client
                .put_inventories(&child, usage.generation, &wanted)
                .await?
            {
                InventoryWrite::Written(generation) => {
                    self.usage = Some(Usage {
                        generation,
                        used: usage.used.clone(),
                    });
                    let shown = published(figures, &wanted, &usage.used);
                    self.published = Some(wanted);
                    return Ok(Some(shown));
                }
                InventoryWrite::Gone => {
                    // Deleted under us (an operator, `openstack resource provider delete`):
                    // find or make it again at the next turn.
                    self.child = None;
                    return Err(PlacementError::Answer {
                        url: format!("/resource_providers/{child}/inventories"),
                        message: "the warm-memory provider is gone (404); making it again".into(),
                    });
                }
                InventoryWrite::GenerationConflict { url, detail } => {
                    conflicts += 1;
                    status.count(State::Conflict);
                    if conflicts > CONFLICT_RETRIES {
                        self.usage = None;
                        return Err(PlacementError::Conflict {
                            url,
                            detail,
                            retries: CONFLICT_RETRIES,
                        });
                    }
                    tracing::info!(
                        provider = %child,
                        generation = usage.generation,
                        "Placement: generation conflict (placement.concurrent_update: allocations or inventory changed since the last update): re-reading the usage"
                    );
                    self.read_usage(&child, demand).await?;
                }
            }
        }
    }

    /// Reads the usage and generation; with `demand`, as the allocations per consumer
    /// (kept in `fresh` for the pool).
    async fn read_usage(&mut self, child: &str, demand: bool) -> Result<(), PlacementError> {
        let (read, what) = if demand {
            let read = self.client.allocations(child).await?.map(|a| {
                let usage = a.usage();
                self.fresh = Some(a);
                usage
            });
            (read, "allocations")
        } else {
            (self.client.usage(child).await?, "usages")
        };
        match read {
            Some(u) => {
                self.usage = Some(u);
                self.last_usage = Some(Instant::now());
                Ok(())
            }
            None => {
                self.child = None;
                Err(PlacementError::Answer {
                    url: format!("/resource_providers/{child}/{what}"),
                    message: "the warm-memory provider is gone (404); making it again".into(),
                })
            }
        }
    }
}

fn published(
    figures: &BTreeMap<PageSize, Figures>,
    wanted: &BTreeMap<String, Inventory>,
    used: &BTreeMap<String, u64>,
) -> Vec<Published> {
    figures
        .keys()
        .filter_map(|ps| {
            let class = class_name(*ps);
            let inv = wanted.get(&class)?;
            Some(Published {
                used: used.get(&class).copied().unwrap_or(0),
                class,
                page_size: ps.name().to_string(),
                total: inv.total,
                reserved: inv.reserved,
                max_unit: inv.max_unit,
            })
        })
        .collect()
}

async fn run(
    pool: Arc<Pool>,
    config: PlacementConfig,
    status: Arc<Status>,
    mut stop: watch::Receiver<bool>,
) {
    let every = config.min_interval;
    let mut session = Session {
        client: Client::new(&config),
        config,
        child: None,
        usage: None,
        published: None,
        last_refresh: None,
        last_usage: None,
        fresh: None,
    };
    let mut backoff = Backoff::default();
    loop {
        if backoff.waiting(Instant::now()) {
            tokio::select! {
                _ = tokio::time::sleep(every) => continue,
                _ = stop.wait_for(|s| *s) => return,
            }
        }
        let reader = Arc::clone(&pool);
        let Ok((pool_status, demand)) =
            tokio::task::spawn_blocking(move || (reader.status(), !reader.adaptive().is_empty()))
                .await
        else {
            return;
        };
        let figures = figures(&pool_status);
        let outcome = tokio::select! {
            r = session.update(&figures, &status, demand) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        // A reading is what Placement held, whether or not the write that followed went.
        if let Some(read) = session.fresh.take().filter(|_| demand) {
            // Off the runtime's threads: a reading may list thousands of consumers.
            let (p, sizes): (_, Vec<PageSize>) =
                (Arc::clone(&pool), figures.keys().copied().collect());
            let _ = tokio::task::spawn_blocking(move || {
                p.set_placement_consumers(read.warm_bytes(sizes));
            })
            .await;
        }
        match outcome {
            Ok(None) => {}
            Ok(Some(shown)) => {
                let failed = backoff.succeed();
                let summary: Vec<String> = shown
                    .iter()
                    .map(|p| {
                        format!(
                            "{} total={} reserved={} used={}",
                            p.class, p.total, p.reserved, p.used
                        )
                    })
                    .collect();
                if failed > 0 {
                    tracing::info!(failed_attempts = failed, inventory = %summary.join(", "), "Placement updated again");
                } else {
                    tracing::debug!(inventory = %summary.join(", "), "Placement updated");
                }
                status.record(State::Ok, summary.join(", "), Some(shown));
            }
            Err(err) => {
                let wait = backoff.fail(Instant::now());
                let state = err.state();
                let text = err.to_string();
                let retry_in_s = wait.as_secs();
                match state {
                    State::Unreachable | State::Conflict => tracing::warn!(
                        state = state.label(), retry_in_s, error = %text,
                        "Placement not updated; leases are unaffected"
                    ),
                    _ => tracing::error!(
                        state = state.label(), retry_in_s, error = %text,
                        "Placement not updated; leases are unaffected"
                    ),
                }
                status.record(state, text, None);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let now = Instant::now();
        let mut b = Backoff::default();
        let waits: Vec<u64> = (0..9).map(|_| b.fail(now).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert!(b.waiting(now + Duration::from_secs(59)));
        assert!(!b.waiting(now + Duration::from_secs(60)));
        assert_eq!(b.succeed(), 9);
        assert!(!b.waiting(now));
        assert_eq!(b.fail(now).as_secs(), 1);
    }
}
