//! Placement's REST API as the publisher needs it, with the credentials of `[placement]`: a
//! fixed token (re-read from `token_file` when Placement refuses it), or a Keystone v3
//! application credential exchanged for a token (renewed before it expires and once on a
//! 401; without `endpoint`, Placement's URL comes from the token's service catalog).
//!
//! Each call asks for the lowest microversion that gives what it needs (below), after reading
//! Placement's version document (`GET /`): a Placement too old for a call fails with an error
//! that says which call needs which microversion, instead of Placement's bare 406.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};

use super::config::{AuthConfig, PlacementConfig};
use super::error::{detail, error_code, PlacementError};
use super::http::{Answer, Http};
use super::inventory::Inventory;
use super::keystone::{catalog_endpoint, token_expiry};
use super::microversion::{
    Microversion, Versions, CREATE_PROVIDER, ENSURE_CLASS, FIND_PROVIDER, PUT_INVENTORIES, USAGES,
};

/// How long before a Keystone token's `expires_at` it is renewed.
pub const RENEW_BEFORE_EXPIRY: Duration = Duration::from_secs(300);

/// What a write of the inventories came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InventoryWrite {
    /// Written; the provider's new generation.
    Written(u64),
    /// The provider is gone (404).
    Gone,
    /// 409 `placement.concurrent_update`: the generation moved (an allocation, another
    /// writer); re-read and write again.
    GenerationConflict {
        /// The URL.
        url: String,
        /// Placement's message.
        detail: String,
    },
}

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
    /// When Keystone's token expires (`expires_at`), if it said.
    expires: Option<SystemTime>,
    catalog_endpoint: Option<String>,
    versions: Option<Versions>,
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
            expires: None,
            catalog_endpoint: None,
            versions: None,
        }
    }

    /// Forgets a Keystone token that expires within [`RENEW_BEFORE_EXPIRY`].
    fn drop_expiring_token(&mut self, now: SystemTime) {
        if self.expires.is_some_and(|e| e <= now + RENEW_BEFORE_EXPIRY) {
            tracing::info!(
                "Placement: the Keystone token expires within 5 minutes; asking for a new one"
            );
            self.token = None;
            self.expires = None;
        }
    }

    /// Re-reads `token_file` after Placement refused the token: `true` when it holds another
    /// token now (rotated by the operator or a tool), to try once more.
    fn reread_token_file(&mut self) -> bool {
        let AuthConfig::Token {
            file: Some(path), ..
        } = &self.auth
        else {
            return false;
        };
        match super::config::secret("token_file", path) {
            Ok(fresh) if Some(&fresh) != self.token.as_ref() => {
                tracing::info!(path = %path.display(), "Placement: read a new token from token_file");
                self.auth = AuthConfig::Token {
                    token: fresh,
                    file: Some(path.clone()),
                };
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::warn!(error = %e, "Placement: cannot re-read token_file");
                false
            }
        }
    }

    /// A token (and, without `endpoint`, Placement's URL), asked of Keystone when needed.
    async fn login(&mut self) -> Result<(String, String), PlacementError> {
        if let AuthConfig::Token { token, .. } = &self.auth {
            self.token = Some(token.clone());
        }
        self.drop_expiring_token(SystemTime::now());
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
                        request: answer.request_id,
                    })
                }
                s => {
                    return Err(PlacementError::Refused {
                        method: "POST".into(),
                        url,
                        status: s,
                        detail: detail(&answer.body),
                        request: answer.request_id,
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
            self.expires = token_expiry(&body);
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

    /// The microversions Placement serves, read from its version document once per session
    /// (again after a 406).
    async fn versions(&mut self, base: &str) -> Result<Versions, PlacementError> {
        if let Some(v) = self.versions {
            return Ok(v);
        }
        let url = format!("{base}/");
        let answer = self.http.send(Method::GET, &url, &[], None).await?;
        if !answer.status.is_success() {
            return Err(PlacementError::Refused {
                method: "GET".into(),
                url,
                status: answer.status,
                detail: detail(&answer.body),
                request: answer.request_id,
            });
        }
        let doc: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        let v = Versions::parse(&doc).ok_or_else(|| PlacementError::Answer {
            url: url.clone(),
            message: "no version document (versions[id=v1.0] with min_version, max_version): is this Placement's root URL?".into(),
        })?;
        tracing::debug!(min = %v.min, max = %v.max, "Placement's microversions");
        self.versions = Some(v);
        Ok(v)
    }

    /// Sends one request to Placement at the lowest microversion that gives `what` (the
    /// call's name, for errors) what it needs; `Ok` for 2xx, 404 and 409 (the caller decides,
    /// the 409's `code` in the value), an error for anything else. A refused Keystone token
    /// is renewed once; a refused fixed token is re-read from `token_file` once.
    async fn call(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        (what, needed): (&'static str, Microversion),
    ) -> Result<(StatusCode, Value, String), PlacementError> {
        let mut renewed = false;
        loop {
            let (token, base) = self.login().await?;
            let versions = self.versions(&base).await?;
            let url = format!("{base}{path}");
            let Some(version) = versions.negotiate(needed) else {
                return Err(PlacementError::TooOld {
                    url: base,
                    call: what,
                    needs: needed.to_string(),
                    max: versions.max.to_string(),
                });
            };
            let headers = [
                (
                    HeaderName::from_static("x-auth-token"),
                    HeaderValue::from_str(&token).map_err(|_| PlacementError::Auth {
                        service: "Placement",
                        url: url.clone(),
                        status: StatusCode::UNAUTHORIZED,
                        detail: "the token is not a valid header value".into(),
                        request: String::new(),
                    })?,
                ),
                (
                    HeaderName::from_static("openstack-api-version"),
                    HeaderValue::from_str(&format!("placement {version}"))
                        .expect("digits and a dot are a valid header value"),
                ),
            ];
            let Answer {
                status,
                body: raw,
                request_id,
                ..
            } = self
                .http
                .send(
                    method.clone(),
                    &url,
                    &headers,
                    body.map(|b| b.to_string().into_bytes()),
                )
                .await?;
            let keystone = matches!(self.auth, AuthConfig::ApplicationCredential { .. });
            match status {
                StatusCode::UNAUTHORIZED if keystone && !renewed => {
                    // The token expired early or was revoked: ask Keystone again, once.
                    tracing::info!(request = %request_id, "Placement: 401 with the Keystone token; asking Keystone for a new one");
                    renewed = true;
                    self.token = None;
                    self.expires = None;
                    continue;
                }
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
                    if !keystone && !renewed && self.reread_token_file() =>
                {
                    renewed = true;
                    continue;
                }
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    return Err(PlacementError::Auth {
                        service: "Placement",
                        url,
                        status,
                        detail: detail(&raw),
                        request: request_id,
                    })
                }
                StatusCode::NOT_ACCEPTABLE => {
                    // The microversion is no longer served (Placement changed under us):
                    // read the version document again at the next call.
                    self.versions = None;
                    return Err(PlacementError::Refused {
                        method: method.to_string(),
                        url,
                        status,
                        detail: format!("microversion {version}: {}", detail(&raw)),
                        request: request_id,
                    });
                }
                s if s.is_success() || s == StatusCode::NOT_FOUND || s == StatusCode::CONFLICT => {
                    let value = if raw.is_empty() || !s.is_success() {
                        json!({
                            "detail": detail(&raw),
                            "code": error_code(&raw),
                            "request": request_id,
                        })
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
                        request: request_id,
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
        let (status, body, url) = self
            .call(
                Method::GET,
                &path,
                None,
                ("finding a provider by name", FIND_PROVIDER),
            )
            .await?;
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
            .call(
                Method::POST,
                "/resource_providers",
                Some(&body),
                ("creating a provider under a parent", CREATE_PROVIDER),
            )
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
            .call(
                Method::PUT,
                &format!("/resource_classes/{class}"),
                None,
                ("creating a resource class", ENSURE_CLASS),
            )
            .await?;
        expect(status, &body, &url, "PUT")
    }

    /// `GET /resource_providers/{uuid}/{part}` (`why`: the call's name and microversion):
    /// the answer and its URL, `None` when the provider is gone (404).
    pub(super) async fn provider_part(
        &mut self,
        uuid: &str,
        part: &str,
        why: (&'static str, Microversion),
    ) -> Result<Option<(Value, String)>, PlacementError> {
        let path = format!("/resource_providers/{uuid}/{part}");
        let (status, body, url) = self.call(Method::GET, &path, None, why).await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        expect(status, &body, &url, "GET")?;
        Ok(Some((body, url)))
    }

    /// The provider's usage and generation.
    pub async fn usage(&mut self, uuid: &str) -> Result<Option<Usage>, PlacementError> {
        let why = ("reading a provider's usage", USAGES);
        let Some((body, url)) = self.provider_part(uuid, "usages", why).await? else {
            return Ok(None);
        };
        Ok(Some(Usage {
            generation: provider_generation(&body, &url)?,
            used: amounts(body.get("usages")),
        }))
    }

    /// Replaces the provider's inventories, at `generation`. A 409 is told apart by its
    /// code: `placement.concurrent_update` (the generation moved) is the caller's to retry;
    /// `placement.inventory.inuse` (a class the write would remove or shrink below its
    /// allocations) and any other are errors.
    pub async fn put_inventories(
        &mut self,
        uuid: &str,
        generation: u64,
        inventories: &BTreeMap<String, Inventory>,
    ) -> Result<InventoryWrite, PlacementError> {
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
                ("writing a provider's inventories", PUT_INVENTORIES),
            )
            .await?;
        let text = |k: &str| value[k].as_str().unwrap_or_default().to_string();
        match status {
            StatusCode::CONFLICT => match value["code"].as_str() {
                Some("placement.concurrent_update") => Ok(InventoryWrite::GenerationConflict {
                    url,
                    detail: text("detail"),
                }),
                Some("placement.inventory.inuse") => Err(PlacementError::InventoryInUse {
                    url,
                    detail: text("detail"),
                    request: text("request"),
                }),
                _ => Err(PlacementError::Refused {
                    method: "PUT".into(),
                    url,
                    status,
                    detail: format!("{} (code {})", text("detail"), text("code")),
                    request: text("request"),
                }),
            },
            StatusCode::NOT_FOUND => Ok(InventoryWrite::Gone),
            _ => {
                expect(status, &value, &url, "PUT")?;
                Ok(InventoryWrite::Written(provider_generation(&value, &url)?))
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

/// The provider's generation in an answer from `url`, an error naming the field without it.
pub(super) fn provider_generation(body: &Value, url: &str) -> Result<u64, PlacementError> {
    body.get("resource_provider_generation")
        .and_then(Value::as_u64)
        .ok_or_else(|| PlacementError::Answer {
            url: url.to_string(),
            message: "no resource_provider_generation".into(),
        })
}

/// The amounts by resource class of a `{"<class>": n}` object (an amount that is no count
/// left out); none when it is absent or no object.
pub(super) fn amounts(classes: Option<&Value>) -> BTreeMap<String, u64> {
    classes
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                .collect()
        })
        .unwrap_or_default()
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
        request: body["request"].as_str().unwrap_or_default().to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(query_escape("host-a:hugeprep x"), "host-a%3Ahugeprep%20x");
    }
}
