//! The warm-memory provider's allocations per consumer (`GET
//! /resource_providers/{uuid}/allocations`): what the publisher reads in place of the usage
//! while the pool has adaptive targets, so that each VM Nova scheduled here is known by its
//! UUID (the instance's, which is also its libvirt domain's) and its size: the known demand
//! of `pool::adaptive`. The answer is capped as every answer is (`http::MAX_ANSWER_BYTES`).

use std::collections::BTreeMap;

use serde_json::Value;

use super::client::{amounts, provider_generation, Client, Usage};
use super::error::PlacementError;
use super::inventory::class_name;
use super::microversion::ALLOCATIONS;
use crate::vmm::libvirt::domain::is_uuid;
use crate::PageSize;

/// A provider's allocations per consumer, and its generation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Allocations {
    /// The provider's generation.
    pub generation: u64,
    /// Amounts by class, per consumer UUID (as Placement spells it).
    pub consumers: BTreeMap<String, BTreeMap<String, u64>>,
}

/// The most consumers one provider's answer may list: a host runs far fewer VMs; more is
/// a broken or hostile Placement, refused before any of it is kept.
pub const MAX_LISTED: usize = 16384;

impl Allocations {
    /// Reads Placement's answer from `url`: `{"allocations": {"<uuid>": {"resources":
    /// {"<class>": n}}}, "resource_provider_generation": g}`. A consumer that is no UUID
    /// and an amount that is no count are left out.
    pub fn parse(body: &Value, url: &str) -> Result<Allocations, PlacementError> {
        let generation = provider_generation(body, url)?;
        let listed = body
            .get("allocations")
            .and_then(Value::as_object)
            .ok_or_else(|| PlacementError::Answer {
                url: url.to_string(),
                message: "no allocations object".into(),
            })?;
        if listed.len() > MAX_LISTED {
            return Err(PlacementError::Answer {
                url: url.to_string(),
                message: format!(
                    "allocations: {} consumers, more than the {MAX_LISTED} one provider may list",
                    listed.len()
                ),
            });
        }
        let consumers = listed
            .iter()
            .filter(|(uuid, _)| is_uuid(uuid))
            .map(|(uuid, a)| (uuid.clone(), amounts(a.get("resources"))))
            .collect();
        Ok(Allocations {
            generation,
            consumers,
        })
    }

    /// The usage they add up to (what `GET .../usages` would answer), and the generation.
    pub fn usage(&self) -> Usage {
        let mut used: BTreeMap<String, u64> = BTreeMap::new();
        for resources in self.consumers.values() {
            for (class, &n) in resources {
                let u = used.entry(class.clone()).or_insert(0);
                *u = u.saturating_add(n);
            }
        }
        Usage {
            generation: self.generation,
            used,
        }
    }

    /// Each consumer's bytes of the warm class of each of `page_sizes` (amounts are MiB);
    /// a consumer with none of them is left out.
    pub fn warm_bytes(
        &self,
        page_sizes: impl IntoIterator<Item = PageSize> + Clone,
    ) -> Vec<(String, BTreeMap<PageSize, u64>)> {
        self.consumers
            .iter()
            .filter_map(|(uuid, resources)| {
                let bytes: BTreeMap<PageSize, u64> = page_sizes
                    .clone()
                    .into_iter()
                    .filter_map(|ps| {
                        let mib = *resources.get(&class_name(ps))?;
                        (mib > 0).then(|| (ps, mib.saturating_mul(1 << 20)))
                    })
                    .collect();
                (!bytes.is_empty()).then(|| (uuid.clone(), bytes))
            })
            .collect()
    }
}

impl Client {
    /// The provider's allocations per consumer, and its generation; `None` when the
    /// provider is gone (404).
    pub async fn allocations(&mut self, uuid: &str) -> Result<Option<Allocations>, PlacementError> {
        let why = ("reading a provider's allocations", ALLOCATIONS);
        let Some((body, url)) = self.provider_part(uuid, "allocations", why).await? else {
            return Ok(None);
        };
        Allocations::parse(&body, &url).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const VM: &str = "5b1e7c2a-4444-4d6f-9a8b-1c2d3e4f5a6b";
    const OTHER: &str = "6E8F0A1C-2222-4B3D-9E5F-7A9B1C3D5E7F";

    #[test]
    fn allocations_give_each_consumers_bytes_and_the_usage() {
        let body = json!({
            "allocations": {
                VM: {"resources": {"CUSTOM_HUGEPREP_WARM_2M": 4, "VCPU": 1}},
                OTHER: {"resources": {"CUSTOM_HUGEPREP_WARM_2M": 2, "CUSTOM_HUGEPREP_WARM_1G": 1024}},
                "not-a-uuid": {"resources": {"CUSTOM_HUGEPREP_WARM_2M": 8}},
                "7a9b1c3d-5e7f-4b3d-9e5f-6e8f0a1c2222": {"resources": {"VCPU": 2}},
            },
            "resource_provider_generation": 7,
        });
        let a = Allocations::parse(&body, "u").unwrap();
        let usage = a.usage();
        assert_eq!(usage.generation, 7);
        assert_eq!(usage.used["CUSTOM_HUGEPREP_WARM_2M"], 6);
        assert_eq!(usage.used["CUSTOM_HUGEPREP_WARM_1G"], 1024);
        let bytes = a.warm_bytes([PageSize::Size2M]);
        assert_eq!(
            bytes,
            vec![
                (
                    VM.to_string(),
                    BTreeMap::from([(PageSize::Size2M, 4 << 20)])
                ),
                (
                    OTHER.to_string(),
                    BTreeMap::from([(PageSize::Size2M, 2 << 20)])
                ),
            ]
        );
        let both = a.warm_bytes([PageSize::Size2M, PageSize::Size1G]);
        assert_eq!(both[1].1[&PageSize::Size1G], 1 << 30);
    }

    #[test]
    fn an_answer_without_its_fields_is_refused_by_name() {
        for (body, field) in [
            (json!({"allocations": {}}), "resource_provider_generation"),
            (json!({"resource_provider_generation": 1}), "allocations"),
        ] {
            let err = Allocations::parse(&body, "u").unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
    }

    #[test]
    fn an_answer_listing_more_consumers_than_a_host_runs_is_refused() {
        let listed: serde_json::Map<String, Value> = (0..=MAX_LISTED)
            .map(|i| {
                let uuid = format!("5b1e7c2a-4444-4d6f-9a8b-{i:012x}");
                (uuid, json!({"resources": {"CUSTOM_HUGEPREP_WARM_2M": 2}}))
            })
            .collect();
        let body = json!({"allocations": listed, "resource_provider_generation": 1});
        let err = Allocations::parse(&body, "u").unwrap_err().to_string();
        assert!(
            err.contains("allocations") && err.contains("16384"),
            "{err}"
        );
    }
}
