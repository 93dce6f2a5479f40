//! `stripelog serve --metrics ADDRESS:PORT`: the served volumes and the NBD server in the
//! Prometheus text exposition format (docs/operations.md, "Metrics"). Nothing is kept for
//! it on the I/O path beyond the engine's and the server's atomic counters: every value is
//! read from them when a scrape arrives.

use crate::serve::Served;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::io::{Read, Write};

use std::time::Duration;
use stripelog_nbd::Server;

/// Longest request head read from a scraper.
const REQUEST_HEAD_MAXIMUM_BYTES: u64 = 8 << 10;
/// A scraper whose request does not arrive within this time, or that does not take the
/// answer within it, is dropped (one scraper at a time: a stuck one must not hold the
/// others off).
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

impl std::fmt::Debug for Served {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Served").finish_non_exhaustive()
    }
}

type Labels<'a> = Vec<(&'static str, &'a str)>;
/// An export's name, its commands and its errors by kind, as one scrape reads them.
type ExportRequests<'a> = (&'a str, Vec<stripelog_nbd::metrics::CommandSnapshot>, Vec<(&'static str, u64)>);

/// One metric family, then its samples.
struct Family<'e> {
    encoder: prometheus_client::encoding::MetricEncoder<'e>,
}

fn family<'e>(
    encoder: &'e mut DescriptorEncoder<'_>,
    name: &'e str,
    help: &str,
    unit: Option<&'e Unit>,
    metric_type: MetricType,
) -> Result<Family<'e>, std::fmt::Error> {
    Ok(Family { encoder: encoder.encode_descriptor(name, help, unit, metric_type)? })
}

impl Family<'_> {
    fn counter(&mut self, labels: &Labels, value: u64) -> Result<(), std::fmt::Error> {
        ConstCounter::new(value).encode(self.encoder.encode_family(labels)?)
    }
    fn counter_fractional(&mut self, labels: &Labels, value: f64) -> Result<(), std::fmt::Error> {
        ConstCounter::new(value).encode(self.encoder.encode_family(labels)?)
    }
    /// Whole values are written as integers ("3740", not "3740.0").
    fn gauge(&mut self, labels: &Labels, value: f64) -> Result<(), std::fmt::Error> {
        let encoder = self.encoder.encode_family(labels)?;
        if value.fract() == 0.0 && value.abs() < (1u64 << 53) as f64 {
            ConstGauge::new(value as i64).encode(encoder)
        } else {
            ConstGauge::new(value).encode(encoder)
        }
    }
}

impl Collector for Served {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(server) = self.server.upgrade() else { return Ok(()) };
        self.encode_nbd(&server, &mut encoder)?;
        let volumes: Vec<(String, stripelog_engine::VolumeStats)> = self
            .volumes
            .iter()
            .filter_map(|(name, volume)| volume.upgrade().map(|volume| (name.clone(), volume.stats())))
            .collect();
        encode_volumes(&volumes, &mut encoder)?;
        self.encode_maintenance(&mut encoder)
    }
}

impl Served {
    fn encode_nbd(&self, server: &Server, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let exports: Vec<ExportRequests> = server
            .exports()
            .iter()
            .zip(server.metrics())
            .map(|(export, metrics)| (export.name.as_str(), metrics.commands(), metrics.errors()))
            .collect();
        let mut requests =
            family(encoder, "stripelog_nbd_requests", "NBD requests answered", None, MetricType::Counter)?;
        for (export, commands, _) in &exports {
            for command in commands {
                requests.counter(&vec![("export", *export), ("command", command.name)], command.requests)?;
            }
        }
        let mut bytes = family(
            encoder,
            "stripelog_nbd_request",
            "Bytes the NBD requests covered (read, written, trimmed, zeroed)",
            Some(&Unit::Bytes),
            MetricType::Counter,
        )?;
        for (export, commands, _) in &exports {
            for command in commands {
                bytes.counter(&vec![("export", *export), ("command", command.name)], command.bytes)?;
            }
        }
        {
            let mut latency = encoder.encode_descriptor(
                "stripelog_nbd_request_duration",
                "Time from reading an NBD request to queuing its reply",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for (export, commands, _) in &exports {
                for command in commands {
                    let labels: Labels = vec![("export", *export), ("command", command.name)];
                    latency.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                        command.latency_sum_seconds,
                        command.latency_count,
                        &command.latency_buckets,
                        None,
                    )?;
                }
            }
        }
        let mut errors =
            family(encoder, "stripelog_nbd_errors", "NBD error replies by error", None, MetricType::Counter)?;
        for (export, _, kinds) in &exports {
            for (kind, count) in kinds {
                errors.counter(&vec![("export", *export), ("kind", kind)], *count)?;
            }
        }
        let mut open = family(encoder, "stripelog_nbd_connections", "NBD connections open", None, MetricType::Gauge)?;
        for (export, metrics) in server.exports().iter().zip(server.metrics()) {
            let value = metrics.connections_open.load(std::sync::atomic::Ordering::Relaxed);
            open.gauge(&vec![("export", export.name.as_str())], value as f64)?;
        }
        let mut accepted = family(
            encoder,
            "stripelog_nbd_connections_accepted",
            "NBD connections that reached transmission",
            None,
            MetricType::Counter,
        )?;
        for (export, metrics) in server.exports().iter().zip(server.metrics()) {
            let value = metrics.connections_total.load(std::sync::atomic::Ordering::Relaxed);
            accepted.counter(&vec![("export", export.name.as_str())], value)?;
        }
        let mut handshakes = family(
            encoder,
            "stripelog_nbd_tls_handshakes",
            "STARTTLS handshakes by result",
            None,
            MetricType::Counter,
        )?;
        let statistics = &server.statistics;
        for (result, count) in
            [("completed", &statistics.tls_handshakes_completed), ("failed", &statistics.tls_handshakes_failed)]
        {
            handshakes.counter(&vec![("result", result)], count.load(std::sync::atomic::Ordering::Relaxed))?;
        }
        Ok(())
    }

    fn encode_maintenance(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let operations = self.maintenance.snapshot();
        type Value = fn(&crate::serve::Operation) -> u64;
        let families: [(&str, &str, Option<Unit>, Value); 3] = [
            (
                "stripelog_maintenance_segments_done",
                "Segments a running rebuild or scrub has done",
                None,
                |operation| operation.segments_done,
            ),
            ("stripelog_maintenance_segments", "Segments a running rebuild or scrub goes through", None, |operation| {
                operation.segments_total
            }),
            (
                "stripelog_maintenance_processed",
                "Bytes a running rebuild has written or a scrub has read",
                Some(Unit::Bytes),
                |operation| operation.bytes,
            ),
        ];
        for (name, help, unit, value) in families {
            let mut metric = family(encoder, name, help, unit.as_ref(), MetricType::Gauge)?;
            for operation in &operations {
                let labels: Labels = vec![("export", &operation.export), ("operation", operation.kind)];
                metric.gauge(&labels, value(operation) as f64)?;
            }
        }
        Ok(())
    }
}

/// The samples of a per-volume family: (value of its one label, or "" without, value).
type VolumeSamples = Vec<(&'static str, f64)>;

/// A per-volume family: (name, help, unit, type, its one label beyond `export` if any,
/// the samples of a volume).
type VolumeFamily = (
    &'static str,
    &'static str,
    Option<Unit>,
    MetricType,
    Option<&'static str>,
    fn(&stripelog_engine::VolumeStats) -> VolumeSamples,
);

/// A family with, for each volume, the samples its function gives: labelled `export`, and
/// its label when there is one. Whole counters are written as integers.
fn per_volume(
    encoder: &mut DescriptorEncoder,
    volumes: &[(String, stripelog_engine::VolumeStats)],
    (name, help, unit, metric_type, label, values): &VolumeFamily,
) -> Result<(), std::fmt::Error> {
    let metric_type = *metric_type;
    let mut metric = family(encoder, name, help, unit.as_ref(), metric_type)?;
    for (volume, stats) in volumes {
        for (label_value, value) in values(stats) {
            let mut labels: Labels = vec![("export", volume)];
            if let Some(label) = *label {
                labels.push((label, label_value));
            }
            match metric_type {
                MetricType::Counter if value.fract() == 0.0 && value < (1u64 << 53) as f64 => {
                    metric.counter(&labels, value as u64)?
                }
                MetricType::Counter => metric.counter_fractional(&labels, value)?,
                _ => metric.gauge(&labels, value)?,
            }
        }
    }
    Ok(())
}

fn encode_volumes(
    volumes: &[(String, stripelog_engine::VolumeStats)],
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    use MetricType::{Counter, Gauge};
    // (name, help, unit, type, label, values)
    let families: [VolumeFamily; 36] = [
        ("stripelog_volume_logical_size", "Size the volume offers", Some(Unit::Bytes), Gauge, None, |stats| {
            vec![("", stats.logical_size_bytes as f64)]
        }),
        ("stripelog_volume_degraded", "1 when a member is missing, failed or rebuilding", None, Gauge, None, |stats| {
            vec![("", stats.degraded as u8 as f64)]
        }),
        ("stripelog_volume_failed", "1 when the volume stopped on an error", None, Gauge, None, |stats| {
            vec![("", stats.failure.is_some() as u8 as f64)]
        }),
        (
            "stripelog_volume_failures_tolerated",
            "Member failures the volume survives from now",
            None,
            Gauge,
            None,
            |stats| vec![("", stats.failures_still_tolerated as f64)],
        ),
        (
            "stripelog_volume_blocks_mapped",
            "Logical blocks that read data now: whole, compressed, or referring to a shared copy",
            None,
            Gauge,
            None,
            |stats| vec![("", stats.blocks_mapped as f64)],
        ),
        (
            "stripelog_volume_stored_data",
            "Data space the mapped blocks' contents take (whole blocks, fragments' shares, each shared copy once)",
            Some(Unit::Bytes),
            Gauge,
            None,
            |stats| vec![("", stats.stored_data_bytes as f64)],
        ),
        (
            "stripelog_volume_flushes",
            "Syncs of the members since the volume was opened (flush requests that arrive during a sync share \
             the next one; the requests are stripelog_nbd_requests{command=\"flush\"})",
            None,
            Counter,
            None,
            |stats| vec![("", stats.flushes as f64)],
        ),
        (
            "stripelog_volume_checkpoints",
            "Checkpoints committed since the volume was opened",
            None,
            Counter,
            None,
            |stats| vec![("", stats.checkpoints as f64)],
        ),
        ("stripelog_cleaner_rounds", "Cleaning rounds run since the volume was opened", None, Counter, None, |stats| {
            vec![("", stats.cleaning_rounds as f64)]
        }),
        (
            "stripelog_cleaner_segments_cleaned",
            "Segments emptied by cleaning since the volume was opened",
            None,
            Counter,
            None,
            |stats| vec![("", stats.segments_cleaned as f64)],
        ),
        (
            "stripelog_cleaner_relocated",
            "Live data the cleaner moved since the volume was opened (physical)",
            Some(Unit::Bytes),
            Counter,
            None,
            |stats| vec![("", stats.member_bytes_relocated as f64)],
        ),
        (
            "stripelog_cleaner_read",
            "Bytes the cleaner read from members since the volume was opened",
            Some(Unit::Bytes),
            Counter,
            None,
            |stats| vec![("", stats.member_bytes_read_cleaning as f64)],
        ),
        ("stripelog_volume_paced_writes", "Client writes the pacer held back", None, Counter, None, |stats| {
            vec![("", stats.paced_writes as f64)]
        }),
        (
            "stripelog_volume_paced",
            "Time client writes waited for the pacer",
            Some(Unit::Seconds),
            Counter,
            None,
            |stats| vec![("", stats.paced_seconds)],
        ),
        (
            "stripelog_volume_reconstructed_blocks",
            "Blocks rebuilt from redundancy on a read",
            None,
            Counter,
            None,
            |stats| vec![("", stats.reconstructed_blocks as f64)],
        ),
        ("stripelog_volume_rebuilding_members", "Members being rebuilt", None, Gauge, None, |stats| {
            vec![("", stats.rebuilding_members.len() as f64)]
        }),
        (
            "stripelog_volume_member_failures",
            "Members failed while the volume was open",
            None,
            Counter,
            None,
            |stats| vec![("", stats.member_failures as f64)],
        ),
        (
            "stripelog_volume_host",
            "Bytes clients wrote, read, zeroed and trimmed since the volume was opened (logical)",
            Some(Unit::Bytes),
            Counter,
            Some("operation"),
            |stats| {
                vec![
                    ("written", stats.host_bytes_written as f64),
                    ("read", stats.host_bytes_read as f64),
                    ("zeroed", stats.host_bytes_zeroed as f64),
                    ("trimmed", stats.host_bytes_trimmed as f64),
                ]
            },
        ),
        (
            "stripelog_volume_member_written",
            "Bytes written to the members since the volume was opened (physical), by what they hold",
            Some(Unit::Bytes),
            Counter,
            Some("kind"),
            |stats| {
                vec![
                    ("data", stats.member_bytes_data as f64),
                    ("relocated", stats.member_bytes_relocated as f64),
                    ("redundancy", stats.member_bytes_redundancy as f64),
                    ("metadata", stats.member_bytes_metadata as f64),
                    ("padding", stats.member_bytes_padding as f64),
                ]
            },
        ),
        (
            "stripelog_volume_unclean_shutdown",
            "1 when this open followed an unclean shutdown (a crash, a kill): recovery replayed the log",
            None,
            Gauge,
            None,
            |stats| vec![("", (!stats.recovery.closed_cleanly) as u8 as f64)],
        ),
        (
            "stripelog_volume_recovery",
            "What recovery did at this open: batches replayed after the checkpoint, unflushed or torn batches \
             discarded, shards repaired, write log entries replayed",
            None,
            Gauge,
            Some("what"),
            |stats| {
                let recovery = &stats.recovery;
                vec![
                    ("batches_replayed", recovery.batches_replayed as f64),
                    ("batches_discarded", recovery.batches_discarded as f64),
                    ("shards_repaired", recovery.shards_repaired as f64),
                    ("write_log_entries_replayed", recovery.write_log_entries_replayed as f64),
                ]
            },
        ),
        (
            "stripelog_volume_write_amplification",
            "Write amplification over the volume's life: bytes written to the members per byte clients wrote \
             (part=\"total\"), and its parts, which add up to it (data, cleaning, redundancy, metadata, padding)",
            None,
            Gauge,
            Some("part"),
            |stats| {
                let amplification = &stats.lifetime_write_amplification;
                vec![
                    ("total", amplification.total),
                    ("data", amplification.data),
                    ("cleaning", amplification.cleaning),
                    ("redundancy", amplification.redundancy),
                    ("metadata", amplification.metadata),
                    ("padding", amplification.padding),
                ]
            },
        ),
        (
            "stripelog_cleaner_write_cost",
            "The cleaner's write cost over the volume's life (the LFS papers' measure, not a write \
             amplification): (new data + relocated) / new data, both as stored",
            None,
            Gauge,
            None,
            |stats| vec![("", stats.lifetime_write_amplification.cleaning_write_cost)],
        ),
        (
            "stripelog_volume_lifetime_host_written",
            "Bytes clients wrote over the volume's life (persisted; after a crash, recovery counts what it replayed)",
            Some(Unit::Bytes),
            Counter,
            None,
            |stats| vec![("", stats.lifetime.host_bytes_written as f64)],
        ),
        (
            "stripelog_volume_write_lock_hold",
            "How long the write lock was held, since the volume was opened: the 99th and 99.9th percentiles \
             and the longest hold (every write takes it; nothing under it waits for a member)",
            Some(Unit::Seconds),
            Gauge,
            Some("quantile"),
            |stats| {
                vec![
                    ("0.99", stats.write_lock_hold_p99_microseconds / 1e6),
                    ("0.999", stats.write_lock_hold_p999_microseconds / 1e6),
                    ("1", stats.write_lock_hold_maximum_microseconds / 1e6),
                ]
            },
        ),
        (
            "stripelog_volume_write_lock_holds",
            "Holds of the write lock since the volume was opened",
            None,
            Counter,
            None,
            |stats| vec![("", stats.write_lock_holds as f64)],
        ),
        ("stripelog_volume_segments", "Segments by state", None, Gauge, Some("state"), |stats| {
            vec![
                ("free", stats.segments_free as f64),
                ("used", stats.segments_used as f64),
                ("waiting_for_flush", stats.segments_waiting_for_flush as f64),
            ]
        }),
        ("stripelog_volume_read_errors", "Read problems by kind", None, Counter, Some("kind"), |stats| {
            vec![
                ("io", stats.read_errors as f64),
                ("checksum", stats.checksum_mismatches as f64),
                ("unrecoverable", stats.unrecoverable_reads as f64),
                ("late", stats.late_reads as f64),
            ]
        }),
        ("stripelog_volume_write_stalls", "Writes that stalled, by cause", None, Counter, Some("cause"), |stats| {
            vec![("buffers", stats.writes_stalled_for_buffers as f64), ("space", stats.writes_stalled_for_space as f64)]
        }),
        (
            "stripelog_volume_write_stall",
            "Time writes stalled, by cause",
            Some(Unit::Seconds),
            Counter,
            Some("cause"),
            |stats| vec![("buffers", stats.buffer_stall_seconds), ("space", stats.space_stall_seconds)],
        ),
        ("stripelog_volume_cache_reads", "Blocks read from RAM, by cache", None, Counter, Some("cache"), |stats| {
            vec![
                ("recent_writes", stats.reads_from_recent_writes as f64),
                ("block", stats.reads_from_block_cache as f64),
            ]
        }),
        ("stripelog_volume_memory", "RAM the volume holds, by use", Some(Unit::Bytes), Gauge, Some("use"), |stats| {
            vec![
                ("index", stats.map_memory_bytes as f64),
                ("checksums", stats.checksum_memory_bytes as f64),
                ("write_buffer", stats.write_buffer_memory_bytes as f64),
                ("cache", stats.cache_memory_bytes as f64),
            ]
        }),
        // The write log's, for the volumes that have one.
        ("stripelog_write_log_size", "Size of the write log", Some(Unit::Bytes), Gauge, None, |stats| {
            stats.write_log.iter().map(|log| ("", log.size_bytes as f64)).collect()
        }),
        ("stripelog_write_log_used", "Write log bytes in use", Some(Unit::Bytes), Gauge, None, |stats| {
            stats.write_log.iter().map(|log| ("", log.used_bytes as f64)).collect()
        }),
        (
            "stripelog_write_log_appended",
            "Bytes appended to the write log",
            Some(Unit::Bytes),
            Counter,
            None,
            |stats| stats.write_log.iter().map(|log| ("", log.bytes_appended as f64)).collect(),
        ),
        ("stripelog_write_log_syncs", "Syncs of the write log", None, Counter, None, |stats| {
            stats.write_log.iter().map(|log| ("", log.syncs as f64)).collect()
        }),
    ];
    for family in &families {
        per_volume(encoder, volumes, family)?;
    }
    encode_members(volumes, encoder)
}

fn encode_members(
    volumes: &[(String, stripelog_engine::VolumeStats)],
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let indices: Vec<Vec<String>> = volumes
        .iter()
        .map(|(_, stats)| stats.members.iter().map(|member| member.index.to_string()).collect())
        .collect();
    let mut state = family(
        encoder,
        "stripelog_member_state",
        "1 for each member's state (active, missing, failed, rebuilding, ...)",
        None,
        MetricType::Gauge,
    )?;
    for ((volume, stats), indices) in volumes.iter().zip(&indices) {
        for (member, index) in stats.members.iter().zip(indices) {
            let labels: Labels =
                vec![("export", volume), ("member", index), ("name", &member.name), ("state", &member.state)];
            state.gauge(&labels, 1.0)?;
        }
    }
    let mut written = family(
        encoder,
        "stripelog_member_written",
        "Bytes written to the member since the volume was opened",
        Some(&Unit::Bytes),
        MetricType::Counter,
    )?;
    for ((volume, stats), indices) in volumes.iter().zip(&indices) {
        for (member, index) in stats.members.iter().zip(indices) {
            written.counter(&vec![("export", volume.as_str()), ("member", index)], member.bytes_written)?;
        }
    }
    let mut latency = family(
        encoder,
        "stripelog_member_read_latency_mean",
        "Recent mean read latency of the member",
        Some(&Unit::Seconds),
        MetricType::Gauge,
    )?;
    for ((volume, stats), indices) in volumes.iter().zip(&indices) {
        for (member, index) in stats.members.iter().zip(indices) {
            latency
                .gauge(&vec![("export", volume.as_str()), ("member", index)], member.read_latency_mean_micros / 1e6)?;
        }
    }
    Ok(())
}

/// The text a scrape gets.
pub(crate) fn render(registry: &Registry) -> String {
    let mut text = String::new();
    if let Err(error) = prometheus_client::encoding::prometheus_text::encode(&mut text, registry) {
        text = format!("# encoding the metrics failed: {error}\n");
    }
    text
}

/// Answer scrapes on `listener` until the process ends: `GET /metrics` gets the metrics,
/// anything else 404. One scraper at a time (Prometheus scrapes every few seconds).
pub(crate) fn serve_metrics(listener: std::net::TcpListener, served: Served) {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(served));
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let _ = stream.set_read_timeout(Some(SCRAPE_TIMEOUT));
        let _ = stream.set_write_timeout(Some(SCRAPE_TIMEOUT));
        let deadline = std::time::Instant::now() + SCRAPE_TIMEOUT;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        let mut limited = (&stream).take(REQUEST_HEAD_MAXIMUM_BYTES);
        while !head.ends_with(b"\r\n\r\n") && !head.ends_with(b"\n\n") && std::time::Instant::now() < deadline {
            match limited.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => break,
            }
        }
        let line = String::from_utf8_lossy(&head);
        let mut words = line.split_whitespace();
        let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        let (status, content_type, body) = if method == "GET" && (path == "/metrics" || path.starts_with("/metrics?")) {
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", render(&registry))
        } else if method == "GET" && path == "/" {
            ("200 OK", "text/plain; charset=utf-8", "stripelog: the metrics are at /metrics\n".to_string())
        } else {
            ("404 Not Found", "text/plain; charset=utf-8", "not found: the metrics are at /metrics\n".to_string())
        };
        let _ = write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}
