//! Placement's REST API as the publisher needs it, with the credentials of `[placement]`: a
//! fixed token, or a Keystone v3 application credential exchanged for a token (and, without
//! `endpoint`, Placement's URL from the token's service catalog).

use std::collections::BTreeMap;

use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};

use super::config::{AuthConfig, PlacementConfig};
use super::error::{detail, PlacementError};
use super::http::{Answer, Http};
use super::inventory::Inventory;

/// The microversion every request asks for: 1.26 lets `reserved` equal `total`, 1.14 gives
/// providers parents, 1.7 creates resource classes with PUT; 1.39 is the newest this was
/// tested with (Placement 16.0.0 serves up to 1.39).
pub const MICROVERSION: &str = "placement 1.39";

/// A resource provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    /// Its uuid.
    pub uuid: String,
    /// Its parent's uuid.
    pub parent: Option<String>,
}

/// A provider's usage and generation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Usage {
    /// The provider's generation.
    pub generation: u64,
    /// Allocated amounts by class.
    pub used: BTreeMap<String, u64>,
}

/// A session with Placement.
#[derive(Debug)]
pub struct Client {
    http: Http,
    auth: AuthConfig,
    endpoint: Option<String>,
    interface: String,
    region: Option<String>,
    token: Option<String>,
    catalog_endpoint: Option<String>,
}

impl Client {
    /// A client for `config`.
    pub fn new(config: &PlacementConfig) -> Client {
        Client {
            http: Http::new(config.timeout, config.cafile.as_deref()),
            auth: config.auth.clone(),
            endpoint: config.endpoint.clone(),
            interface: config.interface.clone(),
            region: config.region_name.clone(),
            token: None,
            catalog_endpoint: None,
        }
    }

    /// A token (and, without `endpoint`, Placement's URL), asked of Keystone when needed.
    async fn login(&mut self) -> Result<(String, String), PlacementError> {
        if let AuthConfig::Token(t) = &self.auth {
            self.token = Some(t.clone());
        }
        let credential = match (&self.token, &self.auth) {
            (
                None,
                AuthConfig::ApplicationCredential {
                    auth_url,
                    id,
                    secret,
                },
            ) => Some((auth_url.clone(), id.clone(), secret.clone())),
            _ => None,
        };
        if let Some((auth_url, id, secret)) = credential {
            let url = format!("{auth_url}/auth/tokens");
            let body = json!({"auth": {"identity": {
                "methods": ["application_credential"],
                "application_credential": {"id": id, "secret": secret},
            }}});
            let answer = self
                .http
                .send(Method::POST, &url, &[], Some(body.to_string().into_bytes()))
                .await?;
            match answer.status {
                StatusCode::CREATED | StatusCode::OK => {}
                s @ (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => {
                    return Err(PlacementError::Auth {
                        service: "Keystone",
                        url,
                        status: s,
                        detail: detail(&answer.body),
                    })
                }
                s => {
                    return Err(PlacementError::Refused {
                        method: "POST".into(),
                        url,
                        status: s,
                        detail: detail(&answer.body),
                    })
                }
            }
            let token = answer
                .headers
                .get("x-subject-token")
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| PlacementError::Answer {
                    url: url.clone(),
                    message: "no X-Subject-Token header".into(),
                })?;
            let body: Value =
                serde_json::from_slice(&answer.body).map_err(|e| PlacementError::Answer {
                    url: url.clone(),
                    message: e.to_string(),
                })?;
            self.catalog_endpoint =
                catalog_endpoint(&body, &self.interface, self.region.as_deref());
            self.token = Some(token.to_string());
        }
        let base = match (&self.endpoint, &self.catalog_endpoint) {
            (Some(e), _) | (None, Some(e)) => e.clone(),
            (None, None) => {
                return Err(PlacementError::Catalog {
                    interface: self.interface.clone(),
                    region: self.region.clone().unwrap_or_else(|| "any".into()),
                })
            }
        };
        Ok((self.token.clone().unwrap_or_default(), base))
    }

    /// Sends one request to Placement; `Ok` for 2xx, 404 and 409 (the caller decides), an
    /// error for anything else. A refused Keystone token is renewed once.
    async fn call(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value, String), PlacementError> {
        let mut renewed = false;
        loop {
            let (token, base) = self.login().await?;
            let url = format!("{base}{path}");
            let headers = [
                (
                    HeaderName::from_static("x-auth-token"),
                    HeaderValue::from_str(&token).map_err(|_| PlacementError::Auth {
                        service: "Placement",
                        url: url.clone(),
                        status: StatusCode::UNAUTHORIZED,
                        detail: "the token is not a valid header value".into(),
                    })?,
                ),
                (
                    HeaderName::from_static("openstack-api-version"),
                    HeaderValue::from_static(MICROVERSION),
                ),
            ];
            let Answer {
                status, body: raw, ..
            } = self
                .http
                .send(
                    method.clone(),
                    &url,
                    &headers,
                    body.map(|b| b.to_string().into_bytes()),
                )
                .await?;
            let renewable = matches!(self.auth, AuthConfig::ApplicationCredential { .. });
            match status {
                StatusCode::UNAUTHORIZED if renewable && !renewed => {
                    // The token expired or was revoked: ask Keystone again, once.
                    renewed = true;
                    self.token = None;
                    continue;
                }
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    return Err(PlacementError::Auth {
                        service: "Placement",
                        url,
                        status,
                        detail: detail(&raw),
                    })
                }
                s if s.is_success() || s == StatusCode::NOT_FOUND || s == StatusCode::CONFLICT => {
                    let value = if raw.is_empty() || !s.is_success() {
                        json!({ "detail": detail(&raw) })
                    } else {
                        serde_json::from_slice(&raw).map_err(|e| PlacementError::Answer {
                            url: url.clone(),
                            message: e.to_string(),
                        })?
                    };
                    return Ok((s, value, url));
                }
                s => {
                    return Err(PlacementError::Refused {
                        method: method.to_string(),
                        url,
                        status: s,
                        detail: detail(&raw),
                    })
                }
            }
        }
    }

    /// The provider named `name`, if there is one.
    pub async fn provider_by_name(
        &mut self,
        name: &str,
    ) -> Result<Option<Provider>, PlacementError> {
        let path = format!("/resource_providers?name={}", query_escape(name));
        let (status, body, url) = self.call(Method::GET, &path, None).await?;
        expect(status, &body, &url, "GET")?;
        let found = body
            .get("resource_providers")
            .and_then(Value::as_array)
            .ok_or_else(|| PlacementError::Answer {
                url: url.clone(),
                message: "no resource_providers list".into(),
            })?;
        Ok(found.first().map(provider))
    }

    /// Creates the provider `name` under `parent`; an existing one of that name is returned.
    pub async fn create_provider(
        &mut self,
        name: &str,
        parent: &str,
    ) -> Result<Provider, PlacementError> {
        let body = json!({"name": name, "parent_provider_uuid": parent});
        let (status, value, url) = self
            .call(Method::POST, "/resource_providers", Some(&body))
            .await?;
        if status == StatusCode::CONFLICT {
            // Made meanwhile (another start of this daemon): use it.
            return self
                .provider_by_name(name)
                .await?
                .ok_or_else(|| PlacementError::Answer {
                    url,
                    message: format!("409 creating {name:?}, and no provider has that name"),
                });
        }
        expect(status, &value, &url, "POST")?;
        Ok(provider(&value))
    }

    /// Creates the custom resource class `class` unless it exists.
    pub async fn ensure_class(&mut self, class: &str) -> Result<(), PlacementError> {
        let (status, body, url) = self
            .call(Method::PUT, &format!("/resource_classes/{class}"), None)
            .await?;
        expect(status, &body, &url, "PUT")
    }

    /// The provider's usage and generation.
    pub async fn usage(&mut self, uuid: &str) -> Result<Option<Usage>, PlacementError> {
        let (status, body, url) = self
            .call(
                Method::GET,
                &format!("/resource_providers/{uuid}/usages"),
                None,
            )
            .await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        expect(status, &body, &url, "GET")?;
        let generation = body
            .get("resource_provider_generation")
            .and_then(Value::as_u64)
            .ok_or_else(|| PlacementError::Answer {
                url: url.clone(),
                message: "no resource_provider_generation".into(),
            })?;
        let used = body
            .get("usages")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Some(Usage { generation, used }))
    }

    /// Replaces the provider's inventories, at `generation`. `Ok(Err(detail))` on a
    /// generation conflict (409), `Ok(Ok(None))` when the provider is gone (404),
    /// `Ok(Ok(Some(generation)))` with the new generation.
    pub async fn put_inventories(
        &mut self,
        uuid: &str,
        generation: u64,
        inventories: &BTreeMap<String, Inventory>,
    ) -> Result<Result<Option<u64>, (String, String)>, PlacementError> {
        let records: serde_json::Map<String, Value> = inventories
            .iter()
            .map(|(class, inv)| (class.clone(), inv.json()))
            .collect();
        let body = json!({
            "resource_provider_generation": generation,
            "inventories": records,
        });
        let (status, value, url) = self
            .call(
                Method::PUT,
                &format!("/resource_providers/{uuid}/inventories"),
                Some(&body),
            )
            .await?;
        match status {
            StatusCode::CONFLICT => Ok(Err((
                url,
                value["detail"].as_str().unwrap_or_default().to_string(),
            ))),
            StatusCode::NOT_FOUND => Ok(Ok(None)),
            _ => {
                expect(status, &value, &url, "PUT")?;
                let generation = value
                    .get("resource_provider_generation")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| PlacementError::Answer {
                        url,
                        message: "no resource_provider_generation".into(),
                    })?;
                Ok(Ok(Some(generation)))
            }
        }
    }
}

fn provider(v: &Value) -> Provider {
    Provider {
        uuid: v["uuid"].as_str().unwrap_or_default().to_string(),
        parent: v["parent_provider_uuid"].as_str().map(str::to_string),
    }
}

fn expect(status: StatusCode, body: &Value, url: &str, method: &str) -> Result<(), PlacementError> {
    if status.is_success() {
        return Ok(());
    }
    Err(PlacementError::Refused {
        method: method.into(),
        url: url.into(),
        status,
        detail: body["detail"].as_str().unwrap_or_default().to_string(),
    })
}

/// Percent-encodes a query value (RFC 3986 unreserved characters stay).
fn query_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Placement's URL in a Keystone v3 token's catalog, for `interface` and `region` (any
/// region when `None`).
pub fn catalog_endpoint(token: &Value, interface: &str, region: Option<&str>) -> Option<String> {
    let catalog = token.pointer("/token/catalog")?.as_array()?;
    catalog
        .iter()
        .filter(|s| s["type"] == "placement")
        .flat_map(|s| s["endpoints"].as_array().into_iter().flatten())
        .find(|e| {
            e["interface"] == interface
                && region.map_or(true, |r| e["region_id"] == r || e["region"] == r)
        })
        .and_then(|e| e["url"].as_str())
        .map(|u| u.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_gives_the_interface_and_region_asked() {
        let token = json!({"token": {"catalog": [
            {"type": "compute", "endpoints": [{"interface": "internal", "region_id": "r1", "url": "http://nova"}]},
            {"type": "placement", "endpoints": [
                {"interface": "public", "region_id": "r1", "url": "https://placement.example/"},
                {"interface": "internal", "region_id": "r1", "url": "http://placement-r1:8778"},
                {"interface": "internal", "region_id": "r2", "url": "http://placement-r2:8778"},
            ]},
        ]}});
        assert_eq!(
            catalog_endpoint(&token, "internal", Some("r2")).as_deref(),
            Some("http://placement-r2:8778")
        );
        assert_eq!(
            catalog_endpoint(&token, "public", None).as_deref(),
            Some("https://placement.example")
        );
        assert_eq!(catalog_endpoint(&token, "admin", None), None);
        assert_eq!(query_escape("host-a:hugeprep x"), "host-a%3Ahugeprep%20x");
    }
}
