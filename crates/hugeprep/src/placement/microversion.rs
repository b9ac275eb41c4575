//! Placement microversions: the lowest one each call needs, and the range a server serves
//! (its version document, `GET /`), so a Placement too old for a call is named as such.

use serde_json::Value;

/// A Placement microversion, `major.minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Microversion(pub u16, pub u16);

impl Microversion {
    /// Parses `1.26`.
    pub fn parse(text: &str) -> Option<Microversion> {
        let (major, minor) = text.trim().split_once('.')?;
        Some(Microversion(major.parse().ok()?, minor.parse().ok()?))
    }
}

impl std::fmt::Display for Microversion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// `GET /resource_providers?name=`: 1.14 answers with `parent_provider_uuid`.
pub const FIND_PROVIDER: Microversion = Microversion(1, 14);
/// `POST /resource_providers` under a parent: 1.14 takes `parent_provider_uuid`, 1.20 answers
/// with the provider made.
pub const CREATE_PROVIDER: Microversion = Microversion(1, 20);
/// `PUT /resource_classes/{name}`: 1.7 creates the class unless it exists.
pub const ENSURE_CLASS: Microversion = Microversion(1, 7);
/// `GET /resource_providers/{uuid}/usages`, with the provider's generation: 1.0.
pub const USAGES: Microversion = Microversion(1, 0);
/// `GET /resource_providers/{uuid}/allocations`, per consumer, with the provider's
/// generation: 1.0.
pub const ALLOCATIONS: Microversion = Microversion(1, 0);
/// `PUT /resource_providers/{uuid}/inventories`: 1.26 lets `reserved` equal `total` (an empty
/// pool), and since 1.23 a 409 says its cause in `code`.
pub const PUT_INVENTORIES: Microversion = Microversion(1, 26);

/// The microversions a Placement serves, from its version document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versions {
    /// The oldest it serves.
    pub min: Microversion,
    /// The newest it serves.
    pub max: Microversion,
}

impl Versions {
    /// Reads the version document of `GET /`
    /// (`{"versions": [{"id": "v1.0", "min_version": "1.0", "max_version": "1.39"}]}`).
    pub fn parse(doc: &Value) -> Option<Versions> {
        let v = doc
            .get("versions")?
            .as_array()?
            .iter()
            .find(|v| v["id"] == "v1.0")?;
        Some(Versions {
            min: Microversion::parse(v["min_version"].as_str()?)?,
            max: Microversion::parse(v["max_version"].as_str()?)?,
        })
    }

    /// The microversion to ask for a call that needs `needed`; `None` when the server is older.
    pub fn negotiate(&self, needed: Microversion) -> Option<Microversion> {
        (needed <= self.max).then_some(needed.max(self.min))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_call_asks_the_lowest_microversion_the_server_serves() {
        let doc = json!({"versions": [{"id": "v1.0", "status": "CURRENT",
            "min_version": "1.0", "max_version": "1.39"}]});
        let v = Versions::parse(&doc).unwrap();
        assert_eq!(v.negotiate(USAGES), Some(Microversion(1, 0)));
        assert_eq!(v.negotiate(ENSURE_CLASS), Some(Microversion(1, 7)));
        assert_eq!(v.negotiate(PUT_INVENTORIES), Some(Microversion(1, 26)));
        // A Queens Placement (1.17) finds providers but cannot write these inventories.
        let queens = Versions {
            min: Microversion(1, 0),
            max: Microversion(1, 17),
        };
        assert_eq!(queens.negotiate(FIND_PROVIDER), Some(Microversion(1, 14)));
        assert_eq!(queens.negotiate(CREATE_PROVIDER), None);
        assert_eq!(queens.negotiate(PUT_INVENTORIES), None);
        assert!(Microversion(1, 9) < Microversion(1, 10));
        assert_eq!(Microversion::parse("1.39"), Some(Microversion(1, 39)));
        assert_eq!(Versions::parse(&json!({"versions": []})), None);
    }
}
