//! Why an inventory update failed, each with what an operator should check.

use axum::http::StatusCode;

use super::http::TransportError;
use super::State;

/// An update of Placement failed.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// No answer: connection refused, timeout, TLS, DNS.
    #[error("Placement unreachable: {0}")]
    Unreachable(#[from] TransportError),
    /// The credentials were refused.
    #[error("{service} refused the credentials ({status}) at {url}: {detail} (request {request}); check [placement] token, token_file or the application credential")]
    Auth {
        /// `Placement` or `Keystone`.
        service: &'static str,
        /// The URL.
        url: String,
        /// 401 or 403.
        status: StatusCode,
        /// The service's message.
        detail: String,
        /// The request's `X-Openstack-Request-Id`, for the service's logs.
        request: String,
    },
    /// Placement serves no microversion new enough for a call.
    #[error("Placement at {url} serves microversions up to {max}, and {call} needs {needs}: upgrade Placement (Rocky, 1.30, serves every call hugeprep makes)")]
    TooOld {
        /// Placement's root URL.
        url: String,
        /// The call.
        call: &'static str,
        /// The microversion it needs.
        needs: String,
        /// The newest the server serves.
        max: String,
    },
    /// 409 `placement.inventory.inuse`: the write would remove a class, or shrink it below
    /// what VMs hold allocated.
    #[error("Placement refused the inventory on {url}: allocations use it (placement.inventory.inuse: {detail}; request {request}); the VMs that hold them must be deleted or moved first (`openstack resource provider usage show`)")]
    InventoryInUse {
        /// The URL.
        url: String,
        /// Placement's message.
        detail: String,
        /// The request's id.
        request: String,
    },
    /// No provider is named after the compute node.
    #[error("no resource provider named {name:?} in Placement: is nova-compute running on this host, and is [placement] compute_node its hypervisor_hostname (`openstack hypervisor list`)?")]
    NoComputeNode {
        /// The name looked for.
        name: String,
    },
    /// A provider of the child's name hangs under another parent.
    #[error("resource provider {name:?} exists under another parent ({parent}) than the compute node's provider ({compute_node}); delete it or change compute_node")]
    WrongParent {
        /// The child's name.
        name: String,
        /// Its parent.
        parent: String,
        /// The compute node's provider.
        compute_node: String,
    },
    /// Generation conflicts beyond the retries.
    #[error("Placement kept answering 409 on {url} ({detail}) after {retries} re-reads")]
    Conflict {
        /// The URL.
        url: String,
        /// Placement's message.
        detail: String,
        /// How many re-reads were tried.
        retries: u32,
    },
    /// Keystone's catalog lists no Placement endpoint for the interface and region.
    #[error("Keystone's catalog has no placement endpoint (interface {interface}, region {region}); set [placement] endpoint")]
    Catalog {
        /// Interface looked for.
        interface: String,
        /// Region looked for.
        region: String,
    },
    /// Any other refusal.
    #[error("{method} {url}: {status}: {detail} (request {request})")]
    Refused {
        /// The method.
        method: String,
        /// The URL.
        url: String,
        /// The status.
        status: StatusCode,
        /// The service's message.
        detail: String,
        /// The request's `X-Openstack-Request-Id`, for the service's logs.
        request: String,
    },
    /// An answer that is not what the API documents.
    #[error("{url}: unexpected answer: {message}")]
    Answer {
        /// The URL.
        url: String,
        /// What is wrong.
        message: String,
    },
}

impl PlacementError {
    /// The publisher's state after this error.
    pub fn state(&self) -> State {
        match self {
            PlacementError::Unreachable(_) => State::Unreachable,
            PlacementError::Auth { .. } => State::Auth,
            PlacementError::NoComputeNode { .. } => State::NoComputeNode,
            PlacementError::Conflict { .. } => State::Conflict,
            PlacementError::WrongParent { .. }
            | PlacementError::TooOld { .. }
            | PlacementError::InventoryInUse { .. }
            | PlacementError::Catalog { .. }
            | PlacementError::Refused { .. }
            | PlacementError::Answer { .. } => State::Error,
        }
    }
}

/// The message of an OpenStack error body (`{"errors": [{"detail": ...}]}`, or Keystone's
/// `{"error": {"message": ...}}`), else the body's text, on one line.
pub fn detail(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let found = parsed.as_ref().and_then(|v| {
        v.pointer("/errors/0/detail")
            .or_else(|| v.pointer("/error/message"))
            .or_else(|| v.get("message"))
            .and_then(|d| d.as_str())
            .map(str::to_string)
    });
    let one_line: Vec<&str> = found
        .as_deref()
        .unwrap_or(&text)
        .split_whitespace()
        .collect();
    let mut out = one_line.join(" ");
    if out.len() > 300 {
        let mut cut = 300;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("...");
    }
    out
}

/// The `code` of an OpenStack error body (`{"errors": [{"code": "placement.concurrent_update"}]}`,
/// Placement 1.23 and later).
pub fn error_code(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.pointer("/errors/0/code")?.as_str().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_come_from_either_error_shape_on_one_line() {
        let placement = br#"{"errors": [{"status": 409, "detail": "There was a conflict.\n\n resource provider generation conflict  "}]}"#;
        assert_eq!(
            detail(placement),
            "There was a conflict. resource provider generation conflict"
        );
        let keystone = br#"{"error": {"code": 401, "message": "The request you have made requires authentication."}}"#;
        assert!(detail(keystone).starts_with("The request you have made"));
        assert_eq!(
            detail(b"<html>bad\ngateway</html>"),
            "<html>bad gateway</html>"
        );
        let inuse =
            br#"{"errors": [{"status": 409, "code": "placement.inventory.inuse", "detail": "x"}]}"#;
        assert_eq!(
            error_code(inuse).as_deref(),
            Some("placement.inventory.inuse")
        );
        assert_eq!(error_code(b"<html>"), None);
    }
}
