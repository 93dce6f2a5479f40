//! The wear report of `stripelog info`: what each member has been written over the
//! volume's life, the write amplification by cause, and, given the drives' rated
//! endurance, their projected life and the safe overwrites per day in the seeds' terms
//! (seed 002: years = endurance ÷ bytes programmed a day ÷ 365; seed 001: overwrites of
//! the usable space a day over the warranty).

use serde::Serialize;
use stripelog_engine::VolumeStats;

const SECONDS_PER_DAY: f64 = 86_400.0;
const DAYS_PER_YEAR: f64 = 365.0;

/// The drives' rated endurance, as the operator gives it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Endurance {
    /// Bytes each drive may be written (TBW) over `warranty_years`.
    BytesWritten { bytes: f64, warranty_years: f64 },
    /// Drive writes per day (of the member size) over `warranty_years`.
    DriveWritesPerDay { drive_writes_per_day: f64, warranty_years: f64 },
}

#[derive(Serialize, Debug)]
pub(crate) struct MemberWear {
    pub index: usize,
    pub name: String,
    /// Written to this member over the volume's life (persisted).
    pub lifetime_bytes_written: u64,
    /// Share of its rated endurance used, when rated.
    pub endurance_used_fraction: Option<f64>,
    /// Years until its rated endurance is used up at the daily rate, when rated.
    pub projected_life_years: Option<f64>,
}

#[derive(Serialize, Debug)]
pub(crate) struct WearReport {
    /// Bytes clients wrote over the volume's life.
    pub host_bytes_written: u64,
    /// Over the volume's life: member bytes per client byte, and its parts by cause
    /// (the same figure as `info`'s lifetime line, `status` and the metrics).
    pub write_amplification: stripelog_engine::WriteAmplification,
    pub volume_age_days: f64,
    /// Host bytes written a day: given, or the volume's own average since it was created.
    pub host_bytes_per_day: f64,
    /// "given" or "measured over the volume's life".
    pub host_bytes_per_day_basis: String,
    /// Each drive's rated endurance in bytes, when given.
    pub rated_bytes_per_drive: Option<f64>,
    /// Times a day the logical size may be overwritten for the warranty at this write
    /// amplification (seed 001's "safe overwrites per day"), when rated.
    pub safe_overwrites_per_day: Option<f64>,
    /// The shortest projected member life, when rated.
    pub projected_life_years: Option<f64>,
    pub members: Vec<MemberWear>,
}

fn ratio(numerator: u64, denominator: u64) -> f64 {
    if denominator == 0 {
        0.0
    } else {
        numerator as f64 / denominator as f64
    }
}

/// The wear of the volume `stats` describes at `now_unix_seconds`.
pub(crate) fn report(
    stats: &VolumeStats,
    endurance: Option<Endurance>,
    host_bytes_per_day: Option<f64>,
    now_unix_seconds: u64,
) -> WearReport {
    let lifetime = &stats.lifetime;
    let host = lifetime.host_bytes_written;
    let age_days = now_unix_seconds.saturating_sub(stats.created_unix_seconds) as f64 / SECONDS_PER_DAY;
    let (per_day, basis) = match host_bytes_per_day {
        Some(given) => (given, "given".to_string()),
        // Less than an hour old: too short to say a day's rate.
        None if age_days >= 1.0 / 24.0 => (host as f64 / age_days, "measured over the volume's life".to_string()),
        None => (0.0, "unknown: the volume is less than an hour old (give --daily-writes)".to_string()),
    };
    let rated = endurance.map(|endurance| match endurance {
        Endurance::BytesWritten { bytes, .. } => bytes,
        Endurance::DriveWritesPerDay { drive_writes_per_day, warranty_years } => {
            drive_writes_per_day * stats.member_size_bytes as f64 * DAYS_PER_YEAR * warranty_years
        }
    });
    let warranty_years = match endurance {
        Some(Endurance::DriveWritesPerDay { warranty_years, .. } | Endurance::BytesWritten { warranty_years, .. }) => {
            warranty_years
        }
        None => 5.0,
    };
    let total = stats.lifetime_write_amplification.total;
    let members: Vec<MemberWear> = stats
        .members
        .iter()
        .map(|member| {
            // This member's share of the volume's member writes, at the daily host rate.
            let member_per_day = per_day * ratio(member.lifetime_bytes_written, host);
            let rated_left = rated.map(|rated| (rated - member.lifetime_bytes_written as f64).max(0.0));
            MemberWear {
                index: member.index,
                name: member.name.clone(),
                lifetime_bytes_written: member.lifetime_bytes_written,
                endurance_used_fraction: rated.map(|rated| member.lifetime_bytes_written as f64 / rated),
                projected_life_years: rated_left
                    .filter(|_| member_per_day > 0.0)
                    .map(|left| left / member_per_day / DAYS_PER_YEAR),
            }
        })
        .collect();
    let safe_overwrites_per_day = rated.filter(|_| total > 0.0).map(|rated| {
        rated * stats.member_count as f64
            / (DAYS_PER_YEAR * warranty_years)
            / total
            / stats.logical_size_bytes.max(1) as f64
    });
    let projected_life_years =
        members.iter().filter_map(|member| member.projected_life_years).min_by(|a, b| a.total_cmp(b));
    WearReport {
        host_bytes_written: host,
        write_amplification: stats.lifetime_write_amplification,
        volume_age_days: age_days,
        host_bytes_per_day: per_day,
        host_bytes_per_day_basis: basis,
        rated_bytes_per_drive: rated,
        safe_overwrites_per_day,
        projected_life_years,
        members,
    }
}
