//! Errors as each API writes them: an HTTP status and, for OpenAI's
//! `{"error": {"message", "type", "param", "code"}}`, for Anthropic's
//! `{"type": "error", "error": {"type", "message"}}`, for Ollama's
//! `{"error": "message"}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Which API's shapes an answer takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI's chat completions, completions and Responses.
    OpenAi,
    /// Anthropic's Messages (`/v1/messages`).
    Anthropic,
    /// Ollama's own (`/api/...`).
    Ollama,
}

impl Dialect {
    /// The dialect of the endpoint at `path`.
    pub fn of_path(path: &str) -> Dialect {
        if path.starts_with("/v1/messages") {
            Dialect::Anthropic
        } else if path.starts_with("/api/") {
            Dialect::Ollama
        } else {
            Dialect::OpenAi
        }
    }
}

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// The error's `type` (`invalid_request_error`, `authentication_error`...).
    pub kind: &'static str,
    /// A machine-readable code, where one applies.
    pub code: Option<&'static str>,
    /// The request field at fault, where one is.
    pub param: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, code: None, param: None }
    }

    /// 400: the request is malformed or asks for something refused.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 about one field of the request.
    pub fn bad_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.to_string()), ..ApiError::bad_request(message) }
    }

    /// 400: the prompt and the reply do not fit in the context.
    pub fn context_full(message: impl Into<String>) -> ApiError {
        ApiError { code: Some("context_length_exceeded"), ..ApiError::bad_request(message) }
    }

    /// 401: the API key is missing or wrong.
    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "a missing or wrong API key: send `Authorization: Bearer KEY` (or `x-api-key: KEY`) with the key the \
                 server was started with",
            )
        }
    }

    /// 404: no model of that id.
    pub fn no_model(id: &str, served: &str) -> ApiError {
        ApiError {
            code: Some("model_not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("no model `{id}`: this server serves `{served}`"),
            )
        }
    }

    /// 405: the endpoint does not answer this method.
    pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
        let message = if method == "OPTIONS" {
            // A browser's CORS preflight: answered only where --cors allows the page's origin.
            format!(
                "{path} does not answer OPTIONS: this server answers a browser's preflight only when it is started \
                 with --cors ORIGIN (serve.cors) allowing the page's origin"
            )
        } else {
            format!("{path} does not answer {method}: the API's endpoints take POST (completions) or GET")
        };
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", message)
    }

    /// 404: no such endpoint.
    pub fn not_found(path: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!(
                "no endpoint {path}: this server answers /v1/chat/completions, /v1/completions, /v1/responses, \
                 /v1/messages, /v1/models, Ollama's /api/chat, /api/generate and /api/tags, /health and /metrics"
            ),
        )
    }

    /// 413: the body is larger than the server reads.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than the {} MiB this server reads ([serve] body_mb)", limit >> 20),
        )
    }

    /// 429: the queue of waiting requests is full.
    pub fn queue_full(waiting: usize) -> ApiError {
        ApiError {
            code: Some("queue_full"),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!("{waiting} requests are already waiting for the model: try again shortly"),
            )
        }
    }

    /// 503: the model is not ready (loading, or it failed to load).
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", message)
    }

    /// 500: the engine failed while answering.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The error object's JSON as `dialect` writes it.
    pub fn body_in(&self, dialect: Dialect) -> serde_json::Value {
        match dialect {
            Dialect::OpenAi => self.body(),
            Dialect::Anthropic => serde_json::json!({
                "type": "error",
                "error": {"type": self.anthropic_type(), "message": self.message},
            }),
            Dialect::Ollama => serde_json::json!({"error": self.message}),
        }
    }

    /// The `error.type` Anthropic's API gives this status.
    fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            500..=599 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The response as `dialect` writes it.
    pub fn response_in(self, dialect: Dialect) -> Response {
        let body = self.body_in(dialect);
        let mut response = self.into_response();
        *response.body_mut() = axum::body::Body::from(body.to_string());
        response
    }

    /// The error object's JSON (OpenAI's shape).
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        let headers = response.headers_mut();
        match self.status {
            // How to authenticate (RFC 6750), and when to come back.
            StatusCode::UNAUTHORIZED => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_S));
            }
            _ => {}
        }
        response
    }
}

/// Seconds a client refused for load (429) or while the model loads
/// (503) is asked to wait before it tries again.
const RETRY_AFTER_S: &str = "1";

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_writes_its_own_error_shape() {
        let e = ApiError::bad_param("temperature", "`temperature` must be 0 to 1");
        assert_eq!(e.body_in(Dialect::OpenAi)["error"]["param"], "temperature");
        let anthropic = e.body_in(Dialect::Anthropic);
        assert_eq!(
            (&anthropic["type"], &anthropic["error"]["type"]),
            (&"error".into(), &"invalid_request_error".into())
        );
        assert_eq!(ApiError::unauthorized().body_in(Dialect::Anthropic)["error"]["type"], "authentication_error");
        assert_eq!(ApiError::queue_full(3).body_in(Dialect::Anthropic)["error"]["type"], "rate_limit_error");
        assert_eq!(ApiError::unavailable("x").body_in(Dialect::Anthropic)["error"]["type"], "overloaded_error");
        assert_eq!(e.body_in(Dialect::Ollama), serde_json::json!({"error": "`temperature` must be 0 to 1"}));
        assert_eq!(Dialect::of_path("/v1/messages/count_tokens"), Dialect::Anthropic);
        assert_eq!(Dialect::of_path("/api/tags"), Dialect::Ollama);
        assert_eq!(Dialect::of_path("/v1/responses"), Dialect::OpenAi);
    }
}
