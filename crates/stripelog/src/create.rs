//! `stripelog create`: a new volume that is what was meant. Everything that can be judged
//! from the arguments and the paths is judged before anything is made: the member count,
//! paths whose directory does not exist or that name a missing device under /dev, new
//! files without a size, members and log devices that hold data. A `create` that fails
//! after all removes the files it made itself (never one that existed before). The spare
//! leaves the cleaner the room it needs once the whole logical space has been written.

use crate::{
    add_write_log, chunk_size, device_error, display_paths, engine_error, open_members, open_read_only, parse_raid,
    refuse_files_holding_data, show_info, units::format_bytes, CreateArguments, DegradedArgument,
};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use stripelog_blockdev::{FileDevice, FileDeviceOptions};
use stripelog_engine::{CreateOptions, Geometry, OpenOptions, RaidLevel, Volume};

/// The spare when `--spare` is not given, unless the cleaner needs more.
pub(crate) const DEFAULT_SPARE_PERCENT: u32 = 20;

pub(crate) fn create(arguments: CreateArguments) -> Result<ExitCode, String> {
    let raid_level = parse_raid(&arguments.raid)?;
    let chunk_size_bytes = chunk_size(arguments.chunk)?;
    // The count before any path is looked up: a member too many is a count mismatch,
    // not a path that does not exist.
    check_count_and_chunk(&arguments.raid, raid_level, arguments.members.len(), chunk_size_bytes)?;
    let new_members = paths_to_create(&arguments.members, arguments.member_size.is_some(), "--member-size")?;
    for log in &arguments.log {
        if arguments.members.contains(log) {
            return Err(format!(
                "{} is a member of the volume: the write log needs a device of its own",
                log.display()
            ));
        }
    }
    let new_logs = paths_to_create(&arguments.log, true, "--log-size")?;
    if !arguments.force {
        refuse_files_holding_data(&arguments.members, arguments.member_size.unwrap_or(0))?;
        refuse_log_devices_holding_data(&arguments.log)?;
    }
    let mut created = CreatedFiles::default();
    let mut members = Vec::new();
    for path in &arguments.members {
        let opened = open_members(std::slice::from_ref(path), Some(arguments.member_size.unwrap_or(0)), false, false);
        if new_members.contains(path) {
            created.record(path);
        }
        members.extend(opened?);
    }
    let smallest_member_bytes =
        members.iter().filter_map(|member| member.device.as_ref()).map(|device| device.size_bytes()).min().unwrap_or(0);
    let mut options = CreateOptions {
        raid_level,
        chunk_size_bytes,
        spare_ppm: arguments.spare.unwrap_or(DEFAULT_SPARE_PERCENT * 10_000),
        volume_uuid: None,
        force: arguments.force,
        compression: arguments.compression,
        logical_size_bytes: arguments.logical_size,
        deduplication: arguments.dedup,
        client_write_pairs: !arguments.one_client_stream,
    };
    options.spare_ppm =
        choose_spare(&options, members.len(), smallest_member_bytes, arguments.spare.is_some(), arguments.force)?;
    let geometry = options.geometry(members.len(), smallest_member_bytes).map_err(engine_error)?;
    if let Some(warning) = not_thin_warning(&geometry, arguments.logical_size) {
        eprintln!("{warning}");
    }
    let open = OpenOptions { holder_program: "stripelog create".into(), ..OpenOptions::default() };
    let volume = Volume::create(members, &options, &open).map_err(engine_error)?;
    volume.close().map_err(|error| error.to_string())?;
    if !arguments.log.is_empty() {
        // The log files are created there; they are ours to remove if that fails.
        let added = add_write_log(&arguments.members, &arguments.log, arguments.log_size, arguments.force);
        for path in &new_logs {
            created.record(path);
        }
        added?;
    }
    created.keep();
    // Read back as `info` would, after the close: the holder record is closed now.
    let stats = open_read_only(&arguments.members, DegradedArgument { degraded: false })?.stats();
    show_info(&stats, arguments.json)?;
    Ok(ExitCode::SUCCESS)
}

/// Refuse a member count the RAID level cannot take, and a chunk size the format cannot,
/// before any path is looked up.
/// `--raid 1` is a two-member mirror (RAID-10 on two members).
fn check_count_and_chunk(
    raid: &str,
    raid_level: RaidLevel,
    member_count: usize,
    chunk_size_bytes: u32,
) -> Result<(), String> {
    let raid = raid.trim().to_ascii_lowercase();
    if matches!(raid.trim_start_matches("raid"), "1") && member_count != 2 {
        return Err(format!(
            "RAID-1 is a mirror of two members: {member_count} given (--raid 10 stripes mirrored pairs over an even \
             number of members)"
        ));
    }
    // Any member size will do to judge the count and the chunk: sizes are judged once
    // the members are open.
    use stripelog_engine::error::GeometryProblem;
    match Geometry::validate(raid_level, member_count, chunk_size_bytes, 0, 1 << 40) {
        Err(problem @ (GeometryProblem::MemberCount { .. } | GeometryProblem::OddRaid10MemberCount { .. })) => {
            Err(format!("{problem} (nothing was created)"))
        }
        Err(problem @ GeometryProblem::ChunkSize { .. }) => Err(format!("{problem} (nothing was created)")),
        _ => Ok(()),
    }
}

/// The paths that do not exist, which `create` makes as sparse files, after refusing
/// what must not be made: a path whose directory does not exist, a path under /dev (a
/// device that is not there), a dangling symbolic link, `missing`, and any new path when
/// no size for it was given (`size_flag`). Nothing is created here.
fn paths_to_create(paths: &[PathBuf], size_given: bool, size_flag: &str) -> Result<Vec<PathBuf>, String> {
    let mut missing = Vec::new();
    for path in paths {
        let name = path.display();
        if path.as_os_str() == "missing" {
            return Err(
                "`missing` stands for an absent member of an existing volume: a new volume needs every member".into()
            );
        }
        match std::fs::symlink_metadata(path) {
            Ok(_) if path.exists() => continue,
            Ok(_) => {
                let target = std::fs::read_link(path).map(|target| target.display().to_string()).unwrap_or_default();
                return Err(format!("{name}: a symbolic link to {target}, which does not exist (no such device)"));
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(format!("{name}: {error}")),
        }
        stripelog_blockdev::refuse_to_create(path).map_err(|reason| format!("{name}: {reason}"))?;
        missing.push(path.clone());
    }
    if !size_given && !missing.is_empty() {
        return Err(format!(
            "{} {} not exist: give {size_flag} to create {} as sparse files (nothing was created)",
            display_paths(&missing),
            if missing.len() == 1 { "does" } else { "do" },
            if missing.len() == 1 { "it" } else { "them" }
        ));
    }
    Ok(missing)
}

/// Before anything is made, refuse existing log devices that hold data or belong to a
/// volume (`add_write_log` looks again when it formats them).
fn refuse_log_devices_holding_data(paths: &[PathBuf]) -> Result<(), String> {
    for path in paths.iter().filter(|path| path.exists()) {
        let name = path.display().to_string();
        let options = FileDeviceOptions { read_only: true, ..FileDeviceOptions::default() };
        let device = FileDevice::open(path, &options).map_err(|error| device_error(&name, error))?;
        let content = stripelog_engine::identity::inspect(&device).map_err(|error| device_error(&name, error))?;
        if content != stripelog_engine::identity::DeviceContent::Empty {
            return Err(format!(
                "{name} {}: refusing to make it a write log unless forced (--force)",
                content.describe()
            ));
        }
    }
    Ok(())
}

/// Free segments the cleaner works in once every block the volume may hold is written:
/// the segments beyond those its data fills (a logical size below the provisioned size
/// caps the data, and leaves more).
pub(crate) fn cleaner_room_segments(geometry: &Geometry) -> u64 {
    let per_segment = geometry.blocks_per_segment() - geometry.summary_blocks_per_segment();
    let held = geometry.logical_block_count().min(geometry.provisioned_block_count());
    geometry.segment_count().saturating_sub(held.div_ceil(per_segment.max(1)))
}

/// The smallest whole percentage from `options.spare_ppm` up that leaves the cleaner its
/// room, if any below 100 %.
pub(crate) fn smallest_working_spare_percent(
    options: &CreateOptions,
    member_count: usize,
    smallest_member_bytes: u64,
) -> Option<u32> {
    (options.spare_ppm.div_ceil(10_000)..100).find(|&percent| {
        let trial = CreateOptions { spare_ppm: percent * 10_000, ..options.clone() };
        trial.geometry(member_count, smallest_member_bytes).is_ok_and(|geometry| {
            cleaner_room_segments(&geometry) >= stripelog_engine::working_spare_segments(&geometry)
        })
    })
}

/// The spare to create with: the one asked for when it leaves the cleaner its room; when
/// none was asked for, the default or the smallest percentage above it that does. A spare
/// asked for that is too small is refused, naming the `--spare` that works, unless
/// `force`: then it is kept, with a warning.
pub(crate) fn choose_spare(
    options: &CreateOptions,
    member_count: usize,
    smallest_member_bytes: u64,
    spare_given: bool,
    force: bool,
) -> Result<u32, String> {
    let geometry = options.geometry(member_count, smallest_member_bytes).map_err(engine_error)?;
    let (room, needed) = (cleaner_room_segments(&geometry), stripelog_engine::working_spare_segments(&geometry));
    if room >= needed {
        return Ok(options.spare_ppm);
    }
    let asked = f64::from(options.spare_ppm) / 10_000.0;
    let working = smallest_working_spare_percent(options, member_count, smallest_member_bytes);
    if let (Some(percent), false) = (working, spare_given) {
        eprintln!(
            "note: spare {percent} % rather than the default {DEFAULT_SPARE_PERCENT} %: at {DEFAULT_SPARE_PERCENT} % \
             the cleaner would have {room} free segments of {} once the whole logical space is written, and it \
             needs {needed} (--spare sets the spare)",
            geometry.segment_count()
        );
        return Ok(percent * 10_000);
    }
    let shortfall = format!(
        "a spare of {asked} % leaves the cleaner {room} free segments of {} once the whole logical space has been \
         written; it needs {needed}, or writes fail with ENOSPC from then on",
        geometry.segment_count()
    );
    if force {
        eprintln!("warning: {shortfall} (created as asked: --force)");
        return Ok(options.spare_ppm);
    }
    let fix = match working {
        Some(percent) => format!("use --spare {percent}% or more, larger members or a smaller --chunk"),
        None => format!(
            "no spare below 100 % does on these members with chunks of {}: use a smaller --chunk or larger members",
            format_bytes(u64::from(options.chunk_size_bytes))
        ),
    };
    Err(format!("{shortfall}: {fix} (--force creates it as asked)"))
}

/// A `--logical-size` below what the volume can hold is a cap, not thin provisioning.
pub(crate) fn not_thin_warning(geometry: &Geometry, logical_size_bytes: Option<u64>) -> Option<String> {
    let logical = logical_size_bytes?;
    let provisioned = geometry.provisioned_block_count() * stripelog_engine::BLOCK_SIZE_BYTES as u64;
    (logical < provisioned).then(|| {
        format!(
            "warning: --logical-size {} is below the {} this volume can hold: it is not thin provisioned, its size is \
             only capped (the rest is room for the cleaner); leave --logical-size out for all of it",
            format_bytes(logical),
            format_bytes(provisioned)
        )
    })
}

/// Files this `create` made, removed again unless it succeeds. Each is known by its
/// device and inode, so that a file someone else put at the path since is never removed.
#[derive(Default)]
struct CreatedFiles {
    files: Vec<(PathBuf, u64, u64)>,
}

impl CreatedFiles {
    fn record(&mut self, path: &Path) {
        if let Ok(metadata) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::MetadataExt;
            if metadata.is_file() {
                self.files.push((path.to_path_buf(), metadata.dev(), metadata.ino()));
            }
        }
    }

    fn keep(&mut self) {
        self.files.clear();
    }
}

impl Drop for CreatedFiles {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        for (path, device, inode) in self.files.drain(..) {
            let ours = std::fs::symlink_metadata(&path)
                .is_ok_and(|metadata| metadata.is_file() && metadata.dev() == device && metadata.ino() == inode);
            if ours && std::fs::remove_file(&path).is_ok() {
                eprintln!("stripelog: removed {} (made by this create)", path.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(spare_percent: u32, chunk_size_bytes: u32) -> CreateOptions {
        CreateOptions {
            raid_level: RaidLevel::Raid5,
            chunk_size_bytes,
            spare_ppm: spare_percent * 10_000,
            ..CreateOptions::default()
        }
    }

    #[test]
    fn a_default_spare_too_small_is_raised_and_one_asked_for_is_refused() {
        // 5 × 32 MiB with 1 MiB chunks: 31 segments, too few spare at 20 %.
        let small = options(DEFAULT_SPARE_PERCENT, 1 << 20);
        let raised = choose_spare(&small, 5, 32 << 20, false, false).expect("raised");
        assert!(raised > DEFAULT_SPARE_PERCENT * 10_000, "{raised}");
        let geometry = CreateOptions { spare_ppm: raised, ..small.clone() }.geometry(5, 32 << 20).unwrap();
        assert!(cleaner_room_segments(&geometry) >= stripelog_engine::working_spare_segments(&geometry));
        let refused = choose_spare(&small, 5, 32 << 20, true, false).unwrap_err();
        assert!(refused.contains(&format!("--spare {}%", raised / 10_000)), "{refused}");
        assert_eq!(choose_spare(&small, 5, 32 << 20, true, true), Ok(small.spare_ppm));
        // Large members: 20 % is room enough.
        let large = options(DEFAULT_SPARE_PERCENT, 64 << 10);
        assert_eq!(choose_spare(&large, 5, 64 << 20, false, false), Ok(200_000));
    }

    #[test]
    fn a_capped_logical_size_counts_as_room_and_is_said_not_to_be_thin() {
        let capped = CreateOptions { logical_size_bytes: Some(8 << 20), ..options(5, 1 << 20) };
        assert_eq!(choose_spare(&capped, 5, 32 << 20, true, false), Ok(50_000));
        let geometry = capped.geometry(5, 32 << 20).unwrap();
        assert!(not_thin_warning(&geometry, Some(8 << 20)).is_some_and(|warning| warning.contains("not thin")));
        assert!(not_thin_warning(&geometry, None).is_none());
        assert!(not_thin_warning(&geometry, Some(1 << 40)).is_none());
    }
}
