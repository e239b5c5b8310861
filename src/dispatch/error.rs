//! The error a handler returns.

use crate::tasks::task::TaskError;
use capwire_envelope::{ErrorBody, ErrorCode, RawValue};

/// The error a handler returns: a wire error code and a message.
///
/// ```
/// use capwire::HandlerError;
/// use capwire::envelope::ErrorCode;
/// let e = HandlerError::new(ErrorCode::NotFound, "no such member");
/// assert_eq!(e.body().code, ErrorCode::NotFound);
/// let app = HandlerError::app("quota_exceeded", "try later").unwrap();
/// assert_eq!(app.body().code.as_str(), "quota_exceeded");
/// ```
#[derive(Debug, Clone)]
pub struct HandlerError(ErrorBody);

impl HandlerError {
    /// An error with one of the framework's codes.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self(ErrorBody::new(code, message))
    }

    /// An error with an application-defined code (`[a-z][a-z0-9_]*`, not one
    /// of the framework's codes).
    ///
    /// # Errors
    /// When `code` is not a valid application code.
    pub fn app(code: &str, message: impl Into<String>) -> Result<Self, capwire_envelope::IdError> {
        let code = ErrorCode::app(code)?;
        Ok(Self(ErrorBody::new(code, message)))
    }

    /// An error with structured detail.
    pub fn with_detail(mut self, detail: RawValue) -> Self {
        self.0.detail = Some(detail);
        self
    }

    /// The error as it travels on the wire.
    pub fn body(&self) -> &ErrorBody {
        &self.0
    }

    pub(crate) fn into_body(self) -> ErrorBody {
        self.0
    }
}

impl From<ErrorBody> for HandlerError {
    fn from(body: ErrorBody) -> Self {
        Self(body)
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.0.code, self.0.message)
    }
}

impl std::error::Error for HandlerError {}

impl From<TaskError> for HandlerError {
    fn from(e: TaskError) -> Self {
        let code = match e {
            TaskError::Ended => ErrorCode::Cancelled,
            TaskError::NoAnswer => ErrorCode::Timeout,
            TaskError::BadAnswer(_) => ErrorCode::BadArgs,
            TaskError::TooLarge => ErrorCode::TooLarge,
            TaskError::Encode(_) | TaskError::Store(_) => ErrorCode::Internal,
        };
        HandlerError::new(code, e.to_string())
    }
}
