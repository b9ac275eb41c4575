//! Decoding request bodies field by field, so that every error names the field at fault.

use serde_json::{Map, Value};

use super::error::ApiError;
use crate::page_size::PageSize;
use crate::policy::pool::Recycle;
use crate::pool::LeaseRequest;

/// The fields of `POST /v1/leases`.
pub const LEASE_FIELDS: [&str; 8] = [
    "name",
    "size",
    "page_size",
    "node",
    "owner",
    "pid",
    "pin",
    "recycle",
];

fn u32_field(obj: &Map<String, Value>, field: &str) -> Result<Option<u32>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                ApiError::field(
                    field,
                    format!("expected an integer 0..=4294967295, got {v}"),
                )
            }),
    }
}

/// Decodes a lease request: malformed JSON, unknown fields, missing or mistyped fields are
/// refused with the field's name.
///
/// ```
/// use hugeprep::api::parse_lease_request;
/// let r = parse_lease_request(br#"{"name":"vm1","size":"4M"}"#).unwrap();
/// assert_eq!(r.size, 4 << 20);
/// assert!(parse_lease_request(br#"{"name":"vm1","size":1,"colour":2}"#).is_err());
/// ```
pub fn parse_lease_request(body: &[u8]) -> Result<LeaseRequest, ApiError> {
    parse_lease_body(body).map(|(req, _key)| req)
}

/// The body field that carries an idempotency key (the `Idempotency-Key` header may carry it
/// instead).
pub const IDEMPOTENCY_FIELD: &str = "idempotency_key";

/// Decodes a lease request and its optional `idempotency_key` (a string), as
/// [`parse_lease_request`] does.
pub fn parse_lease_body(body: &[u8]) -> Result<(LeaseRequest, Option<String>), ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ApiError::BadRequest {
        field: None,
        message: format!("malformed JSON: {e}"),
    })?;
    let Value::Object(obj) = value else {
        return Err(ApiError::BadRequest {
            field: None,
            message: "the body must be a JSON object".into(),
        });
    };
    let known = |k: &str| LEASE_FIELDS.contains(&k) || k == IDEMPOTENCY_FIELD;
    if let Some(unknown) = obj.keys().find(|k| !known(k)) {
        return Err(ApiError::field(
            unknown,
            format!(
                "unknown field {unknown:?}: expected one of {}, {IDEMPOTENCY_FIELD}",
                LEASE_FIELDS.join(", ")
            ),
        ));
    }
    let key = match obj.get(IDEMPOTENCY_FIELD) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => {
            return Err(ApiError::field(
                IDEMPOTENCY_FIELD,
                format!("expected a string of 1 to 128 visible ASCII characters, got {v}"),
            ))
        }
    };
    let name = match obj.get("name") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => {
            return Err(ApiError::field(
                "name",
                format!("expected a string, got {v}"),
            ))
        }
        None => return Err(ApiError::field("name", "missing")),
    };
    let size = match obj.get("size") {
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| ApiError::field("size", format!("expected a byte count, got {n}")))?,
        Some(Value::String(s)) => {
            crate::units::parse_bytes(s).map_err(|e| ApiError::field("size", e.to_string()))?
        }
        Some(v) => {
            return Err(ApiError::field(
                "size",
                format!("expected a byte count, got {v}"),
            ))
        }
        None => return Err(ApiError::field("size", "missing")),
    };
    let page_size = match obj.get("page_size") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            s.parse::<PageSize>()
                .map_err(|e| ApiError::field("page_size", e.to_string()))?,
        ),
        Some(v) => {
            return Err(ApiError::field(
                "page_size",
                format!("expected \"2M\" or \"1G\", got {v}"),
            ))
        }
    };
    let owner = match obj.get("owner") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(v) => {
            return Err(ApiError::field(
                "owner",
                format!("expected a user name or uid, got {v}"),
            ))
        }
    };
    let pin = match obj.get("pin") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(ApiError::field(
                "pin",
                format!("expected true or false, got {v}"),
            ))
        }
    };
    let recycle = match obj.get("recycle") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "proven" => Some(Recycle::Proven),
        Some(Value::String(s)) if s == "kernel" => Some(Recycle::Kernel),
        Some(v) => {
            return Err(ApiError::field(
                "recycle",
                format!("expected \"proven\" or \"kernel\", got {v}"),
            ))
        }
    };
    let req = LeaseRequest {
        name,
        size,
        page_size,
        node: u32_field(&obj, "node")?,
        owner,
        pid: u32_field(&obj, "pid")?,
        pin,
        recycle,
    };
    Ok((req, key))
}

/// Decodes a JSON body into `T`; errors name the field at fault by its path (`targets[0].node`),
/// or none when the body is not JSON at all.
pub fn decode_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let field = if path == "." || path.is_empty() {
            unknown_field(&inner.to_string())
        } else {
            Some(path)
        };
        match field {
            Some(field) => ApiError::field(&field, format!("{field}: {inner}")),
            None => ApiError::BadRequest {
                field: None,
                message: format!("malformed request: {inner}"),
            },
        }
    })?;
    de.end().map_err(|e| ApiError::BadRequest {
        field: None,
        message: format!("malformed request: {e}"),
    })?;
    Ok(value)
}

/// The field a serde message names, for errors at the top level (`unknown field `x``,
/// `missing field `x``).
fn unknown_field(message: &str) -> Option<String> {
    ["unknown field `", "missing field `"].iter().find_map(|p| {
        let rest = &message[message.find(p)? + p.len()..];
        Some(rest[..rest.find('`')?].to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(body: &str) -> Option<String> {
        match parse_lease_request(body.as_bytes()) {
            Err(ApiError::BadRequest { field, .. }) => field,
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(field_of(r#"{"name":"a"}"#).as_deref(), Some("size"));
        assert_eq!(field_of(r#"{"size":1}"#).as_deref(), Some("name"));
        assert_eq!(
            field_of(r#"{"name":"a","size":-1}"#).as_deref(),
            Some("size")
        );
        assert_eq!(
            field_of(r#"{"name":"a","size":"3 apples"}"#).as_deref(),
            Some("size")
        );
        assert_eq!(
            field_of(r#"{"name":"a","size":1,"page_size":"4K"}"#).as_deref(),
            Some("page_size")
        );
        assert_eq!(
            field_of(r#"{"name":"a","size":1,"node":"x"}"#).as_deref(),
            Some("node")
        );
        assert_eq!(
            field_of(r#"{"name":"a","size":1,"pid":-3}"#).as_deref(),
            Some("pid")
        );
        assert_eq!(
            field_of(r#"{"name":"a","size":1,"evil":true}"#).as_deref(),
            Some("evil")
        );
        assert_eq!(
            field_of(r#"{"name":"a","size":1,"pin":"yes"}"#).as_deref(),
            Some("pin")
        );
        assert_eq!(field_of(r#"{"name":"a","#), None);
        assert_eq!(field_of("[1]"), None);
    }

    #[test]
    fn full_request_decodes() {
        let r = parse_lease_request(
            br#"{"name":"vm","size":2097152,"page_size":"2M","node":0,"owner":"root","pid":1}"#,
        )
        .unwrap();
        assert_eq!(r.page_size, Some(PageSize::Size2M));
        assert_eq!(r.owner.as_deref(), Some("root"));
        assert_eq!(r.pid, Some(1));
    }
}
