//! The command's OpenTelemetry export: the spans of every call (target
//! `capwire::otel`, see `capwire::trace`) sent to an OTLP collector over
//! HTTP (protobuf), configured by the standard `OTEL_*` variables.
//!
//! Export is on when `OTEL_TRACES_EXPORTER` is `otlp`, or when it is unset
//! and `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//! is set; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it
//! off. The exporter reads the endpoint, headers and timeout
//! (`OTEL_EXPORTER_OTLP_*`), the SDK the sampler (`OTEL_TRACES_SAMPLER`,
//! `OTEL_TRACES_SAMPLER_ARG`), the batch processor (`OTEL_BSP_*`) and the
//! resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`). With export
//! off, no OpenTelemetry layer is installed and a call's spans cost one
//! branch.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::registry::LookupSpan;

/// The log's directive that keeps call spans and their events out of it.
pub(crate) const QUIET: &str = "capwire::otel=off";

/// The running export: flushed and stopped by [`Otel::shutdown`].
pub(crate) struct Otel {
    provider: SdkTracerProvider,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// What the environment asks for: `Ok(true)` to export, `Ok(false)` not
/// to, `Err` for a setting this command cannot honour (said on stderr, and
/// nothing is exported).
fn wanted() -> Result<bool, String> {
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    let endpoint = var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
        || var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some();
    let on = match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
        None => endpoint,
        Some("none") => false,
        Some("otlp") => true,
        Some(other) => {
            return Err(format!(
                "OTEL_TRACES_EXPORTER={other} is not supported (only otlp and none): traces are not exported"
            ));
        }
    };
    if !on {
        return Ok(false);
    }
    let protocol =
        var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"));
    match protocol.as_deref().map(str::trim) {
        None | Some("http/protobuf") => Ok(true),
        Some(other) => Err(format!(
            "OTLP protocol {other} is not supported (only http/protobuf): traces are not exported"
        )),
    }
}

impl Otel {
    /// The export the environment asks for, as `service` unless
    /// `OTEL_SERVICE_NAME` names it; `None` when it asks for none (or for
    /// one this command cannot make, which is said on stderr).
    pub(crate) fn from_env(service: &str) -> Option<Self> {
        match wanted() {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                eprintln!("capwire: {e}");
                return None;
            }
        }
        let exporter = match opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
        {
            Ok(e) => e,
            Err(e) => {
                eprintln!(
                    "capwire: the OTLP exporter could not be made ({e}): traces are not exported"
                );
                return None;
            }
        };
        let mut resource = Resource::builder();
        if var("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name(service.to_owned());
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        Some(Self { provider })
    }

    /// The layer that turns capwire's call spans into OpenTelemetry spans
    /// (only those: other targets are not exported).
    pub(crate) fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let tracer = self.provider.tracer("capwire");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            // What a call's span says is in its fields; the source
            // location, the thread and busy/idle times would cost every
            // span (and every poll) for nothing a trace needs.
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(Targets::new().with_target(capwire::trace::SPAN_TARGET, LevelFilter::INFO))
    }

    /// Sends what is left and stops the export (outside the runtime: the
    /// exporter's client blocks).
    pub(crate) fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("capwire: the last traces could not be exported: {e}");
        }
    }
}
