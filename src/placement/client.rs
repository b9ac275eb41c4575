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

/// The `User-Agent` of every request: `hugeprep/VERSION`.
pub const USER_AGENT: &str = concat!("hugeprep/", env!("CARGO_PKG_VERSION"));

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

    /// The provider's usage and generation.
    pub async fn usage(&mut self, uuid: &str) -> Result<Option<Usage>, PlacementError> {
        let (status, body, url) = self
            .call(
                Method::GET,
                &format!("/resource_providers/{uuid}/usages"),
                None,
                ("reading a provider's usage", USAGES),
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
                let generation = value
                    .get("resource_provider_generation")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| PlacementError::Answer {
                        url,
                        message: "no resource_provider_generation".into(),
                    })?;
                Ok(InventoryWrite::Written(generation))
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
        request: body["request"].as_str().unwrap_or_default().to_string(),
    })
}

/// When a Keystone v3 token expires: its `expires_at` (`2026-11-27T01:00:00.000000Z`).
pub fn token_expiry(token: &Value) -> Option<SystemTime> {
    parse_utc(token.pointer("/token/expires_at")?.as_str()?)
}

/// Parses an ISO 8601 UTC time as Keystone writes it: `YYYY-MM-DDTHH:MM:SS[.frac](Z|+00:00)`.
pub fn parse_utc(text: &str) -> Option<SystemTime> {
    let text = text
        .strip_suffix('Z')
        .or_else(|| text.strip_suffix("+00:00"))
        .unwrap_or(text);
    let (date, time) = text.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<u64>().ok());
    let (h, min, sec) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || min > 59 || sec > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm), proleptic Gregorian.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    let nanos: u32 = if frac.is_empty() {
        0
    } else {
        let digits: String = frac.chars().take(9).collect();
        let n: u32 = digits.parse().ok()?;
        n * 10u32.pow(9 - digits.len() as u32)
    };
    Some(
        SystemTime::UNIX_EPOCH
            + Duration::from_secs(days * 86_400 + h * 3600 + min * 60 + sec)
            + Duration::from_nanos(u64::from(nanos)),
    )
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

    #[test]
    fn keystone_expiry_times_parse() {
        let t = parse_utc("2026-11-27T01:00:00.000000Z").unwrap();
        let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(secs, 1_795_741_200);
        let t = parse_utc("1970-01-01T00:00:01.5+00:00").unwrap();
        assert_eq!(
            t.duration_since(SystemTime::UNIX_EPOCH).unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            parse_utc("2000-03-01T00:00:00Z")
                .unwrap()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_secs(),
            951_868_800
        );
        assert!(parse_utc("2026-13-01T00:00:00Z").is_none());
        assert!(parse_utc("yesterday").is_none());
        let token = json!({"token": {"expires_at": "2026-11-27T01:00:00.000000Z"}});
        assert!(token_expiry(&token).is_some());
    }
}
