//! Every route and every error shape of the running daemon against `docs/openapi.yaml`: the
//! document is read with `serde_yaml`, its schemas turned into JSON Schema (OpenAPI 3.0's
//! `nullable` as a `null` alternative) and each answer validated with the `jsonschema` crate.
//! Each answer's status must be documented for its operation, its media type must match, and
//! the test must have exercised every operation the document lists (and no other). The
//! request bodies that succeeded are validated against the documented request schemas too.

mod daemon_util;

use std::collections::BTreeSet;

use daemon_util::{http_text, Env, MIB};
use serde_json::{json, Map, Value};

/// The OpenAPI document.
struct Spec {
    doc: Value,
    components: Value,
}

/// OpenAPI 3.0 schema to JSON Schema: `nullable: true` becomes a `null` alternative; `format`
/// (OpenAPI's `uint64`) is dropped.
fn to_json_schema(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, x) in m {
                if k != "nullable" && k != "format" {
                    out.insert(k.clone(), to_json_schema(x));
                }
            }
            if m.get("nullable") == Some(&Value::Bool(true)) {
                json!({"anyOf": [Value::Object(out), {"type": "null"}]})
            } else {
                Value::Object(out)
            }
        }
        Value::Array(a) => Value::Array(a.iter().map(to_json_schema).collect()),
        other => other.clone(),
    }
}

impl Spec {
    fn load() -> Spec {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.yaml");
        let text = std::fs::read_to_string(path).unwrap();
        let doc: Value = serde_yaml::from_str(&text).unwrap();
        let components = to_json_schema(&doc["components"]);
        Spec { doc, components }
    }

    fn operations(&self) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for (path, item) in self.doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                if method != "parameters" {
                    out.insert((path.clone(), method.to_uppercase()));
                }
            }
        }
        out
    }

    /// Follows a `$ref` into the document.
    fn resolve<'a>(&'a self, v: &'a Value) -> &'a Value {
        match v["$ref"].as_str() {
            Some(r) => self
                .doc
                .pointer(r.trim_start_matches('#'))
                .unwrap_or_else(|| panic!("dangling $ref {r}")),
            None => v,
        }
    }

    fn validate(&self, schema: &Value, instance: &Value, what: &str) {
        let root = json!({"allOf": [to_json_schema(schema)], "components": self.components});
        let validator = jsonschema::draft202012::new(&root)
            .unwrap_or_else(|e| panic!("{what}: the document's schema does not compile: {e}"));
        let errors: Vec<String> = validator
            .iter_errors(instance)
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect();
        assert!(
            errors.is_empty(),
            "{what}: the answer does not match docs/openapi.yaml:\n{}\n{instance:#}",
            errors.join("\n")
        );
    }

    /// Checks one answer of `method template` against the document.
    fn check_response(&self, method: &str, template: &str, status: u16, head: &str, body: &str) {
        let what = format!("{method} {template} -> {status}");
        let op = &self.doc["paths"][template][method.to_lowercase()];
        assert!(op.is_object(), "{what}: not in docs/openapi.yaml");
        let response = op["responses"]
            .get(status.to_string())
            .or_else(|| op["responses"].get("default"))
            .unwrap_or_else(|| panic!("{what}: status not documented\n{body}"));
        self.check_content(self.resolve(response), head, body, &what);
    }

    fn check_content(&self, response: &Value, head: &str, body: &str, what: &str) {
        let content = response["content"].as_object().unwrap();
        let media = head
            .lines()
            .find_map(|l| l.strip_prefix("content-type:"))
            .map(|v| v.split(';').next().unwrap().trim().to_string())
            .unwrap_or_default();
        let (_, media_spec) = content
            .iter()
            .find(|(m, _)| **m == media)
            .unwrap_or_else(|| panic!("{what}: content type {media:?} not documented"));
        let instance = if media == "application/json" {
            serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {body}"))
        } else {
            Value::String(body.to_string())
        };
        if let Some(headers) = response["headers"].as_object() {
            for name in headers.keys() {
                let lower = format!("{}:", name.to_lowercase());
                assert!(head.contains(&lower), "{what}: no {name} header\n{head}");
            }
        }
        self.validate(&media_spec["schema"], &instance, what);
    }

    fn check_request(&self, method: &str, template: &str, body: &str) {
        let op = &self.doc["paths"][template][method.to_lowercase()];
        let schema = &op["requestBody"]["content"]["application/json"]["schema"];
        if body.trim().is_empty() || schema.is_null() {
            return;
        }
        let instance: Value = serde_json::from_str(body).unwrap();
        self.validate(schema, &instance, &format!("request {method} {template}"));
    }
}

#[test]
fn every_route_and_error_matches_the_openapi_document() {
    let spec = Spec::load();
    let env = Env::new("openapi", 64 * MIB);
    let d = env.spawn(&["--warm", "8M"]);
    d.settle(8 * MIB);
    let mut seen = BTreeSet::new();
    let mut call =
        |method: &str, template: &str, path: &str, headers: &[(&str, &str)], body: &str| {
            let (status, head, text) = http_text(&env.socket, method, path, headers, body);
            spec.check_response(method, template, status, &head, &text);
            if (200..300).contains(&status) {
                spec.check_request(method, template, body);
            }
            seen.insert((template.to_string(), method.to_string()));
            (
                status,
                head,
                serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
            )
        };

    for route in [
        "/v1/version",
        "/v1/cpu",
        "/v1/pool",
        "/v1/capacity",
        "/v1/pool/adaptive",
        "/metrics",
        "/v1/leases",
    ] {
        assert_eq!(call("GET", route, route, &[], "").0, 200, "{route}");
    }
    // Ready (200) or degraded (503): the body has the documented shape either way.
    let health = call("GET", "/health", "/health", &[], "");
    assert!(matches!(health.0, 200 | 503), "{:?}", health.2);

    // Leases: made, replayed, refused, listed, released.
    let (status, _, lease) = call(
        "POST",
        "/v1/leases",
        "/v1/leases",
        &[],
        r#"{"name":"a","size":"4M","page_size":"2M","node":0,"pin":false}"#,
    );
    assert_eq!(status, 201);
    let key = [("Idempotency-Key", "k1")];
    assert_eq!(
        call(
            "POST",
            "/v1/leases",
            "/v1/leases",
            &key,
            r#"{"name":"b","size":4194304}"#
        )
        .0,
        201
    );
    let (status, head, _) = call(
        "POST",
        "/v1/leases",
        "/v1/leases",
        &key,
        r#"{"name":"b","size":4194304}"#,
    );
    assert_eq!(status, 200);
    assert!(head.contains("idempotent-replayed: true"));
    let refused: &[(u16, &str)] = &[
        (409, r#"{"name":"a","size":"4M"}"#),
        (422, r#"{"name":"c","size":"1T"}"#),
        (422, r#"{"name":"c","size":"2M","idempotency_key":"k1"}"#),
        (400, r#"{"name":"c","size":"3M"}"#),
        (400, r#"{"name":"c","size":"2M","colour":1}"#),
        (400, r#"{"name":"../c","size":"2M"}"#),
        (400, r#"{"name":"c""#),
        (400, "[]"),
    ];
    for (want, body) in refused {
        assert_eq!(
            call("POST", "/v1/leases", "/v1/leases", &[], body).0,
            *want,
            "{body}"
        );
    }
    let id = lease["id"].as_u64().unwrap();
    let one = format!("/v1/leases/{id}");
    assert_eq!(call("GET", "/v1/leases/{id}", &one, &[], "").0, 200);
    for (method, path, want) in [
        ("GET", "/v1/leases/x", 400),
        ("GET", "/v1/leases/1", 404),
        ("DELETE", "/v1/leases/x", 400),
        ("DELETE", "/v1/leases/1", 404),
        ("DELETE", one.as_str(), 200),
    ] {
        assert_eq!(
            call(method, "/v1/leases/{id}", path, &[], "").0,
            want,
            "{method} {path}"
        );
    }

    // Targets and the pool's controls.
    let t = "/v1/pool/targets";
    assert_eq!(call("GET", t, t, &[], "").0, 200);
    let body = r#"{"targets":[{"page_size":"2M","node":0,"warm":"16M","flavors":[{"size":"8M","count":2}]}]}"#;
    assert_eq!(call("PUT", t, t, &[], body).0, 200);
    assert_eq!(
        call(
            "PUT",
            t,
            t,
            &[],
            r#"{"targets":[{"page_size":"2M","warm":"3M","sizes":["3M"]}]}"#
        )
        .0,
        400
    );
    assert_eq!(call("PUT", t, t, &[], "{}").0, 400);
    // An adaptive target, then its report (the look follows soon; either shape validates).
    let adaptive = r#"{"targets":[{"page_size":"2M","goal":99.5,"ceiling":"16M"}]}"#;
    assert_eq!(call("PUT", t, t, &[], adaptive).0, 200);
    let a = "/v1/pool/adaptive";
    assert_eq!(call("GET", a, a, &[], "").0, 200);
    assert_eq!(call("DELETE", t, t, &[], "").0, 200);
    let (drain, resume) = ("/v1/pool/drain", "/v1/pool/resume");
    assert_eq!(call("POST", drain, drain, &[], r#"{"colour":1}"#).0, 400);
    assert_eq!(call("POST", drain, drain, &[], r#"{"node":99}"#).0, 400);
    assert_eq!(
        call("POST", drain, drain, &[], r#"{"node":0,"page_size":"2M"}"#).0,
        200
    );
    assert_eq!(
        call("POST", resume, resume, &[], r#"{"page_size":"1G"}"#).0,
        400
    );
    assert_eq!(call("POST", resume, resume, &[], "").0, 200);

    // Every operation of the document was exercised, and nothing else.
    assert_eq!(seen, spec.operations());

    // An unknown route: 404 with the documented error shape.
    let (status, head, text) = http_text(&env.socket, "GET", "/v2/nothing", &[], "");
    assert_eq!(status, 404);
    let error = spec.resolve(&spec.doc["components"]["responses"]["Error"]);
    spec.check_content(error, &head, &text, "GET /v2/nothing");

    for l in d.leases() {
        d.release(l.id).unwrap();
    }
}
