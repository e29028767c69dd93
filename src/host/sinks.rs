//! The telemetry files a host writes while it runs (`telemetry.csv`,
//! `telemetry.route_trace`): opened from the configuration, fed every
//! decode call, closed with the session's totals.

use std::path::Path;

use crate::config::RunConfig;
use crate::engine::{OpenReport, StepReport};
use crate::telemetry::csv::CsvSink;
use crate::telemetry::summary::RunSummary;
use crate::telemetry::trace::RouteTraceSink;

/// The open telemetry files.
#[derive(Default)]
pub struct Sinks {
    csv: Option<CsvSink>,
    route: Option<RouteTraceSink>,
    /// The first write error, reported once.
    error: Option<String>,
}

impl Sinks {
    /// Opens the files `config` names.
    pub fn open(config: &RunConfig, model: &Path, info: &OpenReport) -> Result<Sinks, String> {
        let t = &config.telemetry;
        let mut sinks = Sinks::default();
        if !t.csv.as_os_str().is_empty() {
            let csv = CsvSink::create(&t.csv, &config.resolved_pairs(), info)
                .map_err(|e| format!("creating {}: {e}", t.csv.display()))?;
            sinks.csv = Some(csv);
        }
        if !t.route_trace.as_os_str().is_empty() {
            if !info.streaming {
                return Err(
                    "a route trace needs streaming (moe.stream): routing is only observed while streaming".into()
                );
            }
            let route = RouteTraceSink::create(&t.route_trace, model, info)
                .map_err(|e| format!("creating {}: {e}", t.route_trace.display()))?;
            sinks.route = Some(route);
        }
        Ok(sinks)
    }

    /// Writes one decode call to every open file.
    pub fn write(&mut self, report: &StepReport) {
        let csv = self.csv.as_mut().map_or(Ok(()), |c| c.row(report));
        let route = csv.and_then(|()| self.route.as_mut().map_or(Ok(()), |t| t.rows(report)));
        if let Err(e) = route {
            self.error.get_or_insert(format!("writing telemetry: {e}"));
        }
    }

    /// A write error since the last call, once.
    pub fn take_error(&mut self) -> Option<String> {
        self.error.take()
    }

    /// Writes the trailers and closes the files.
    pub fn finish(&mut self, summary: &RunSummary) -> Result<(), String> {
        if let Some(c) = self.csv.take() {
            c.finish(summary).map_err(|e| format!("writing telemetry: {e}"))?;
        }
        if let Some(t) = self.route.take() {
            t.finish().map_err(|e| format!("writing telemetry: {e}"))?;
        }
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
