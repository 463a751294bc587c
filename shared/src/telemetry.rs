//! Tracing setup: human or JSON logs, and OTLP trace export when `--otlp-endpoint` is set.

use crate::config::{LogFormat, TelemetryArgs};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Keeps the trace exporter alive; flushes pending spans when dropped.
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(e) = provider.shutdown() {
                eprintln!("trace exporter shutdown failed: {e}");
            }
        }
    }
}

/// Installs the global subscriber for `service`. Call once, from `main`, inside a Tokio runtime
/// when OTLP export is on. A second call (tests embedding several services) is a no-op.
pub fn init(service: &'static str, args: &TelemetryArgs) -> anyhow::Result<TelemetryGuard> {
    let filter = EnvFilter::try_new(&args.log_level)?;
    let fmt_layer = match args.log_format {
        LogFormat::Human => tracing_subscriber::fmt::layer().with_writer(std::io::stderr).boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let mut provider = None;
    let otel_layer = match &args.otlp_endpoint {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone())
                .build()?;
            let p = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    opentelemetry_sdk::Resource::builder()
                        .with_service_name(service)
                        .build(),
                )
                .build();
            let tracer = p.tracer(service);
            provider = Some(p);
            Some(tracing_opentelemetry::layer().with_tracer(tracer))
        }
        None => None,
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt_layer)
        .with(otel_layer)
        .try_init();
    Ok(TelemetryGuard { provider })
}
