//! API errors and the one function that maps them to HTTP status codes.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::pool::PoolError;

/// Seconds a client answered 503 (a refused unix socket connection, a daemon shutting down)
/// is told to wait before it comes back.
pub const RETRY_AFTER_S: u64 = 1;

/// The JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, with the limit that was crossed.
    pub error: String,
    /// The request field at fault, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The limit a `429` answer is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<Box<LimitBody>>,
}

/// The limit a request would have crossed (`429 Too Many Requests`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitBody {
    /// The limit's name: `leased_bytes.2M`, `leases`, `descriptors`, `reserve_limit (node N)`.
    pub name: String,
    /// The limit.
    pub limit: u64,
    /// What the principal holds now (for `reserve_limit`: what hugeprep added to the node).
    pub in_use: u64,
    /// What the request asked for on top.
    pub asked: u64,
    /// The principal that asked.
    pub principal: String,
}

/// An API request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body or a path parameter is malformed or names an unknown field.
    #[error("{message}")]
    BadRequest {
        /// The field at fault.
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// No such route.
    #[error("no route for {method} {path}")]
    NoRoute {
        /// Method.
        method: String,
        /// Path.
        path: String,
    },
    /// The pool refused or failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A blocking task died.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// A bad-request error about `field`.
    pub fn field(field: &str, message: impl Into<String>) -> ApiError {
        ApiError::BadRequest {
            field: Some(field.to_string()),
            message: message.into(),
        }
    }

    /// A short name of the error's kind, for `hugeprep_errors_total{kind}`.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "bad_request",
            ApiError::NoRoute { .. } => "no_route",
            ApiError::Internal(_) => "internal",
            ApiError::Pool(e) => match e {
                PoolError::Field { .. } => "bad_request",
                PoolError::DuplicateName { .. } => "duplicate_name",
                PoolError::Insufficient { .. } => "insufficient",
                PoolError::NotFound { .. } => "not_found",
                PoolError::ShuttingDown => "shutting_down",
                PoolError::Pin(_) => "pin",
                PoolError::KeyReused { .. } => "idempotency_key_reused",
                PoolError::Journal(_) => "journal",
                PoolError::File(_) => "file",
                PoolError::Fault(_) => "fault",
                PoolError::Reserve(_) => "reserve",
                PoolError::Io { .. } => "io",
                PoolError::Dir(_) => "directory",
                PoolError::OverLimit { .. } => "over_limit",
            },
        }
    }

    fn field_name(&self) -> Option<String> {
        match self {
            ApiError::BadRequest { field, .. } => field.clone(),
            ApiError::Pool(e) => e.field().map(str::to_string),
            _ => None,
        }
    }
}

/// The HTTP status for an error: 4xx for anything the client can fix, 5xx for the host.
pub fn status_of(err: &ApiError) -> StatusCode {
    match err {
        ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
        ApiError::NoRoute { .. } => StatusCode::NOT_FOUND,
        ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        ApiError::Pool(e) => match e {
            PoolError::Field { .. } => StatusCode::BAD_REQUEST,
            PoolError::DuplicateName { .. } => StatusCode::CONFLICT,
            PoolError::Insufficient { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            PoolError::NotFound { .. } => StatusCode::NOT_FOUND,
            PoolError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            // The host cannot pin this lease (memlock limit, memory, no io_uring).
            PoolError::Pin(_) => StatusCode::UNPROCESSABLE_ENTITY,
            PoolError::KeyReused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            PoolError::OverLimit { .. } => StatusCode::TOO_MANY_REQUESTS,
            PoolError::Journal(_)
            | PoolError::File(_)
            | PoolError::Fault(_)
            | PoolError::Reserve(_)
            | PoolError::Io { .. }
            | PoolError::Dir(_) => StatusCode::INTERNAL_SERVER_ERROR,
        },
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // The route layer counts answers by this kind (`hugeprep_errors_total{kind}`).
        let kind = ErrorKind(self.kind());
        let mut response = self.answer();
        response.extensions_mut().insert(kind);
        response
    }
}

impl ApiError {
    /// The answer: status, and the body naming the field at fault.
    fn answer(self) -> Response {
        let status = status_of(&self);
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        }
        let limit = match &self {
            ApiError::Pool(PoolError::OverLimit {
                principal,
                limit,
                max,
                in_use,
                asked,
            }) => Some(Box::new(LimitBody {
                name: limit.clone(),
                limit: *max,
                in_use: *in_use,
                asked: *asked,
                principal: principal.clone(),
            })),
            _ => None,
        };
        let body = ErrorBody {
            error: self.to_string(),
            field: self.field_name(),
            limit,
        };
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // Shutting down: a restart follows, so the client is told when to come back.
            let after = RETRY_AFTER_S.to_string();
            return (
                status,
                [(axum::http::header::RETRY_AFTER, after)],
                axum::Json(body),
            )
                .into_response();
        }
        (status, axum::Json(body)).into_response()
    }
}

/// The kind of an error answer ([`ApiError::kind`]), carried in the response's extensions
/// for the route layer to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorKind(pub &'static str);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_mistakes_are_4xx_naming_the_field() {
        let e = ApiError::Pool(PoolError::DuplicateName { name: "a".into() });
        assert_eq!(status_of(&e), StatusCode::CONFLICT);
        assert_eq!(e.field_name().as_deref(), Some("name"));
        let e = ApiError::field("size", "too big");
        assert_eq!(status_of(&e), StatusCode::BAD_REQUEST);
        assert_eq!(
            status_of(&ApiError::Pool(PoolError::NotFound { id: 1 })),
            StatusCode::NOT_FOUND
        );
    }
}
