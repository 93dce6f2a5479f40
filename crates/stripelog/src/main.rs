//! `stripelog`: the command line. CLI and glue only: parsing, opening members by path,
//! printing reports. The work is done by the engine and benchmark crates.

mod bench;
mod create;
mod logging;
mod maintenance;
mod metrics;
mod notify;
mod plan;
mod serve;
mod sim;
mod units;
mod wear;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use stripelog_blockdev::{BlockDevice, FileDevice, FileDeviceOptions};
use stripelog_engine::{CheckReport, MemberDevice, OpenOptions, RaidLevel, Volume, VolumeStats};
use units::format_bytes;

const EXAMPLES: &str = concat!(
    "\
Examples:
  # a RAID-5 volume on five sparse 4 GiB files (created if missing)
  stripelog create --raid 5 --chunk 1MiB --spare 20% --member-size 4GiB d/m0 d/m1 d/m2 d/m3 d/m4
  # what it holds, for people and for scripts
  stripelog info d/m0 d/m1 d/m2 d/m3 d/m4
  stripelog info --json d/m0 d/m1 d/m2 d/m3 d/m4
  # a member is gone: open degraded (RAID-5/6/10 only)
  stripelog info d/m0 missing d/m2 d/m3 d/m4
  # verify every checksum and parity row
  stripelog check d/m0 d/m1 d/m2 d/m3 d/m4
  # random 4 KiB writes against the members' own sequential bandwidth
  stripelog bench engine --dir /var/tmp/stripelog-bench --duration 10s
Sizes: ",
    size_rule!(),
    "."
);

#[derive(Parser)]
#[command(name = "stripelog", version, about = "Log-structured, full-stripe RAID for flash drives", after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines at this level and above go to standard error, one structured line each
    /// (per-connection lines are at debug).
    #[arg(long, global = true, value_enum, default_value = "info")]
    log_level: logging::LogLevel,
}

#[derive(Subcommand)]
enum Command {
    /// Create a new volume on MEMBER... (missing files are created sparse, with --member-size).
    #[command(after_help = concat!(
        "Examples:\n",
        "  stripelog create --raid 6 --chunk 1MiB --spare 27% /dev/sdb /dev/sdc /dev/sdd /dev/sde\n",
        "  stripelog create --raid 5 --member-size 4GiB d/m0 d/m1 d/m2 d/m3 d/m4   # files in the existing d/\n",
        "Nothing is made unless all of it can be: a member whose directory does not exist, a missing name\n",
        "under /dev (no such device), a new file without --member-size, a member or log holding data\n",
        "(without --force) or a spare too small for the cleaner (see --spare) is refused first, and the\n",
        "files a failed create made are removed again.\n",
        "Sizes: ", size_rule!(), "."
    ))]
    Create(CreateArguments),
    /// Show a volume's geometry, space and counters.
    #[command(
        after_help = "Examples:\n  stripelog info --json d/m0 d/m1 d/m2 d/m3 d/m4\n  # the drives' projected life: rated 600 TB written each, or 1 drive write a day for 5 years\n  stripelog info --drive-tbw 600TB d/m0 d/m1 d/m2 d/m3 d/m4\n  stripelog info --drive-writes-per-day 1 --warranty-years 5 --daily-writes 2TB d/m0 d/m1 d/m2 d/m3 d/m4"
    )]
    Info(InfoArguments),
    /// Verify every live block's checksum and every parity row (read-only); the exit
    /// status says what was found, as fsck's does.
    #[command(
        after_help = "Exit status (bits added together, as fsck's):\n  0  clean\n  1  leftovers of an unclean shutdown that the next read-write open repairs by itself (stripes torn after the last durable point, write log entries not replayed yet): serve the volume\n  2  damage redundancy can repair, or members missing: run `stripelog scrub` or `stripelog replace`\n  4  damage nothing can repair (blocks lost, counts wrong): restore the blocks `check` names\n  8  the check could not run (the volume did not open, a member could not be read)\n\nExample:\n  stripelog check d/m0 d/m1 d/m2 d/m3 d/m4 && echo clean"
    )]
    Check(InspectArguments),
    /// Convert a volume written by an older stripelog to the current on-disk format (one
    /// way: older releases cannot open it afterwards). Read-only opens need no upgrade.
    #[command(after_help = "Example:\n  stripelog upgrade d/m0 d/m1 d/m2 d/m3 d/m4")]
    Upgrade(UpgradeArguments),
    /// Serve volumes over NBD (a Unix socket by default; TCP with --listen; TLS with --tls-certificates).
    ///
    /// SIGINT or SIGTERM finishes the requests in flight, flushes and closes the volumes; one
    /// that arrives while the volumes open takes effect once they are open (they are then
    /// closed without being served). A second signal exits at once. Under systemd
    /// (Type=notify, $NOTIFY_SOCKET) it sends READY=1 once it listens with its volumes open,
    /// STOPPING=1 when it begins to stop, and STATUS= lines on what it is doing.
    #[command(
        after_help = "Examples:\n  stripelog serve d/m0 d/m1 d/m2 d/m3 d/m4 --socket ./stripelog.sock\n  stripelog serve --export a=d/a0,d/a1,d/a2 --export b=d/b0,d/b1,d/b2 --listen 10809\n  nbdinfo 'nbd+unix:///stripelog?socket=./stripelog.sock'\n  # at boot: wait up to 90 s for the drives to appear, then open (the systemd unit does)\n  stripelog serve --wait-for-members 90s /dev/disk/by-id/nvme-A /dev/disk/by-id/nvme-B /dev/disk/by-id/nvme-C\n  # TLS on the network, clients with certificates from ca-cert.pem only (docs/tls.md)\n  stripelog serve d/m0 d/m1 d/m2 --listen 0.0.0.0:10809 --tls-certificates /etc/stripelog/tls --tls-verify-peer\n  nbdinfo 'nbds://server:10809/stripelog?tls-certificates=/etc/stripelog/client-tls'"
    )]
    Serve(ServeArguments),
    /// Replace a member and rebuild its content onto the new one (offline, or online with --control).
    #[command(
        after_help = "Examples:\n  # offline: the volume is not served\n  stripelog replace --member 2 --with d/new2 d/m0 d/m1 d/m2 d/m3 d/m4\n  # online: a running `stripelog serve --socket s.sock` listens on s.sock.control\n  stripelog replace --control s.sock.control --member d/m2 --with d/new2 --rate 200MiB"
    )]
    Replace(maintenance::ReplaceArguments),
    /// Read and verify every live block and parity row; repair what redundancy allows.
    #[command(
        after_help = "Examples:\n  stripelog scrub d/m0 d/m1 d/m2 d/m3 d/m4\n  stripelog scrub --control s.sock.control --rate 500MiB --json\nExit status 1 when blocks are beyond repair (they are listed by logical address)."
    )]
    Scrub(maintenance::ScrubArguments),
    /// Change a volume's setting, served (--control) or offline.
    #[command(
        after_help = "Examples:\n  stripelog set compression=off --control s.sock.control\n  stripelog set compression=lz4 d/m0 d/m1 d/m2\n  stripelog set dedup=off --control s.sock.control\nOnly a volume created with --compression lz4 can compress, and one created with --dedup on deduplicate."
    )]
    Set(maintenance::SetArguments),
    /// What a running server is doing: each export's health, clients, space, counters and
    /// the rebuilds or scrubs under way, through its control socket.
    #[command(
        after_help = "Examples:\n  stripelog status --control s.sock.control\n  stripelog status --control s.sock.control --json\n  watch -n 1 stripelog status --control s.sock.control"
    )]
    Status(maintenance::StatusArguments),
    /// A running server's exports every interval, as rates: requests and bytes a second,
    /// flushes, free segments, write amplification, cleaning rounds.
    #[command(
        after_help = "Examples:\n  stripelog top --control s.sock.control\n  stripelog top --control s.sock.control --interval 5s --count 12 > load.txt"
    )]
    Top(maintenance::TopArguments),
    /// A volume's write log: add or remove one (docs/write-log.md).
    #[command(subcommand)]
    Log(LogCommand),
    /// Benchmarks that print figures.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Experiments: the cleaner on in-memory members; the seeds' flash experiments on
    /// simulated drives.
    #[command(subcommand)]
    Sim(SimCommand),
    /// The seeds' capacity, cost, endurance and IOPS arithmetic for a drive set: md RAID
    /// and stripelog topologies side by side (docs/planner.md).
    #[command(after_help = PLAN_EXAMPLES)]
    Plan(plan::PlanArguments),
    /// Print the completion script of a shell (bash, zsh, fish, elvish, powershell).
    #[command(
        after_help = "Examples:\n  stripelog completions bash > /usr/share/bash-completion/completions/stripelog\n  stripelog completions zsh > /usr/share/zsh/vendor-completions/_stripelog\n  source <(stripelog completions bash)"
    )]
    Completions { shell: clap_complete::Shell },
    /// Write the man pages (stripelog.1 and one per command, e.g. stripelog-serve.1) into
    /// DIRECTORY, generated from this CLI's own definition.
    #[command(after_help = "Example:\n  stripelog manpages /usr/share/man/man1 && man stripelog-serve")]
    Manpages { directory: PathBuf },
}

const PLAN_EXAMPLES: &str = "Examples:
  stripelog plan --preset crucial-m550
  stripelog plan --preset samsung-sm843tn --drives 12 --spare 20% --licence-per-tib 0,0
  stripelog plan --drive-size 3.84TB --price 310 --drive-writes-per-day 1 --read-iops 700000 \\
      --write-iops 90000 --linear-write 2000 --drives 12 --chassis-cost 6000 --daily-writes 10TB --json
  stripelog plan --config plan.toml
  stripelog info --json d/m0 d/m1 d/m2 > info.json; stripelog plan --preset crucial-m550 --compression-of info.json
  stripelog plan --list-presets";

#[derive(Subcommand)]
enum SimCommand {
    /// Write amplification of the cleaner: fill the volume, overwrite it with 4 KiB writes
    /// of the chosen distribution, measure over the last half; printed next to the
    /// analytic greedy figure for uniform writes.
    #[command(
        after_help = "Examples:\n  stripelog sim gc --workload uniform --spare 27%\n  stripelog sim gc --workload hotcold:90/10 --spare 13% --policy greedy --json gc.json\n  stripelog sim gc --workload zipf:0.8 --spare 27% --passes 12"
    )]
    Gc(GcSimArguments),
    /// Seed 004's write saturation on a simulated drive: IOPS each virtual second from
    /// fresh out of the box, with the drive's own spare and with total spare raised.
    #[command(
        after_help = "Examples:\n  stripelog sim overprovisioning\n  stripelog sim overprovisioning --drive sandforce-1200 --seconds 1800\n  stripelog sim overprovisioning --full --json op.json --chart op.png"
    )]
    Overprovisioning(sim::OverprovisioningArguments),
    /// Seed 003's lame RAID: sequential writes to six simulated drives whose garbage
    /// collection pauses strike at independent times — each alone, a naive in-order stripe
    /// writer, and stripelog's writer.
    #[command(
        after_help = "Examples:\n  stripelog sim lame-raid\n  stripelog sim lame-raid --drives 8 --chunk 1MiB --slowdown 8\n  stripelog sim lame-raid --full --json lame.json --chart lame.png"
    )]
    LameRaid(sim::LameRaidArguments),
    /// Seeds 000-002's wear: 4 KiB random writes to eight simulated drives as md RAID-10,
    /// md RAID-5 and stripelog RAID-5/6 — IOPS, RAID and drive write amplification, NAND
    /// bytes per host byte and projected life.
    #[command(
        after_help = "Examples:\n  stripelog sim wear\n  stripelog sim wear --drives barefoot,sandforce-1200 --spare 27%\n  stripelog sim wear --full --json wear.json --chart wear.png"
    )]
    Wear(sim::WearArguments),
}

#[derive(Args)]
struct GcSimArguments {
    /// uniform, hotcold:HOT/BLOCKS (HOT % of writes to BLOCKS % of the blocks) or zipf:EXPONENT.
    #[arg(long, default_value = "uniform")]
    workload: stripelog_bench::gc::Workload,
    /// Spare fraction of the data space.
    #[arg(long, default_value = "27%", value_parser = units::parse_fraction_ppm)]
    spare: u32,
    /// Victim selection: greedy or cost-benefit.
    #[arg(long, default_value_t = stripelog_engine::CleaningPolicy::default())]
    policy: stripelog_engine::CleaningPolicy,
    /// One log for client writes and relocated blocks (the baseline without separation).
    #[arg(long)]
    no_separation: bool,
    /// Client writes in one stream: cold ones are not placed apart (relocated blocks still
    /// are, unless --no-separation).
    #[arg(long)]
    one_client_stream: bool,
    /// Segments of the volume. The cleaner keeps 5 of them in reserve, counted in the spare:
    /// 0.5 % of 1024 segments, which at 7 % spare raises the figure by 7 %; real volumes
    /// have tens of thousands.
    #[arg(long, default_value_t = 2048)]
    segments: u64,
    /// Chunk size (a segment is one chunk per member: 256 KiB on the 4 data members of
    /// the experiment's RAID-5 make segments of 256 blocks and 2.5 GiB of RAM for 2048).
    #[arg(long, default_value = "256KiB", value_parser = units::parse_size)]
    chunk: u64,
    /// Overwrites after the fill, in multiples of the logical size.
    #[arg(long, default_value_t = 8.0)]
    passes: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the report as JSON to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct CreateArguments {
    /// RAID level: 0, 1 (two-member mirror), 10, 5 or 6.
    #[arg(long, default_value = "5")]
    raid: String,
    /// Chunk written to one member per segment: a power of two from 64KiB to 16MiB.
    #[arg(long, default_value = "1MiB", value_parser = units::parse_size)]
    chunk: u64,
    /// Share of the data capacity held back from the logical size: the room the cleaner
    /// works in (27% or 0.27). Default: 20%, or the smallest whole percentage above it
    /// that leaves the cleaner its room on small members. A spare given here that is too
    /// small is refused, naming the one that works (--force keeps it: writes then fail
    /// with ENOSPC once the whole logical space has been written).
    #[arg(long, value_parser = units::parse_fraction_ppm)]
    spare: Option<u32>,
    /// Size of member files to create, required when a member path does not exist (its
    /// directory must). Ignored for block devices and existing larger files.
    #[arg(long, value_parser = units::parse_size)]
    member_size: Option<u64>,
    /// Print the new volume's info as JSON.
    #[arg(long)]
    json: bool,
    /// Overwrite members that hold data or belong to a volume (create refuses them
    /// otherwise, naming what it found).
    #[arg(long)]
    force: bool,
    /// Compress blocks with LZ4 and pack the fragments, up to 16 per block
    /// (docs/compression.md). Fixed at creation that the volume can compress: one created
    /// with lz4 can turn it off and on again (`stripelog set compression=off`), one
    /// created off cannot turn it on.
    #[arg(long, default_value = "off")]
    compression: stripelog_engine::format::CompressionSetting,
    /// Thin provisioning: a logical size of the volume's own (e.g. 64GiB), larger than
    /// the data it may hold (the data capacity less --spare). Writes that would hold more
    /// fail with ENOSPC, nothing written before is harmed, and trims free room again.
    /// A size below the data it may hold only caps the volume (a warning says so).
    #[arg(long, value_parser = units::parse_block_multiple_size)]
    logical_size: Option<u64>,
    /// Deduplicate blocks inline (docs/deduplication.md): equal 4 KiB blocks are stored
    /// once, up to 254 logical blocks per copy, each found by a small index and compared
    /// byte for byte before it is shared. Fixed at creation that the volume can: one
    /// created on can turn it off and on again (`stripelog set dedup=off`), one created
    /// off cannot turn it on.
    #[arg(long, default_value = "off", value_parser = units::parse_on_off, action = clap::ArgAction::Set)]
    dedup: bool,
    /// Keep client writes in one stream. By default, writes to regions of the volume that
    /// are seldom written go to a stream of their own, so that long-lived data is not
    /// copied out of segments full of short-lived data (docs/garbage-collection.md,
    /// "Streams"); older stripelog then refuses the volume (feature bit 5).
    #[arg(long)]
    one_client_stream: bool,
    /// A write log on this fast device or file (an NVMe namespace, PMEM, a partition of a
    /// drive with power-loss protection): flushes and FUA writes are durable once there.
    /// Twice: a mirrored log (docs/write-log.md).
    #[arg(long = "log", value_name = "PATH")]
    log: Vec<PathBuf>,
    /// Size of a log file to create (ignored for block devices and existing files).
    #[arg(long, default_value = "1GiB", value_parser = units::parse_size)]
    log_size: u64,
    /// Members in order: files, block devices.
    #[arg(required = true)]
    members: Vec<PathBuf>,
}

#[derive(Args)]
struct LogAddArguments {
    /// The log's device or file; twice for a mirrored log.
    #[arg(long = "device", value_name = "PATH", required = true)]
    devices: Vec<PathBuf>,
    /// Size of a log file to create (ignored for block devices and existing files).
    #[arg(long, default_value = "1GiB", value_parser = units::parse_size)]
    size: u64,
    /// Overwrite a log device that holds data or belongs to a volume.
    #[arg(long)]
    force: bool,
    /// The volume's members in order.
    #[arg(required = true)]
    members: Vec<PathBuf>,
}

#[derive(Args)]
struct LogRemoveArguments {
    /// The volume's members in order.
    #[arg(required = true)]
    members: Vec<PathBuf>,
}

#[derive(Subcommand)]
enum LogCommand {
    /// Give a volume (not being served, closed cleanly) a write log; formats the device(s).
    #[command(after_help = "Examples:
  stripelog log add --device /dev/pmem0 d/m0 d/m1 d/m2 d/m3 d/m4
  stripelog log add --device /dev/nvme0n1p1 --device /dev/nvme1n1p1 d/m0 d/m1 d/m2 d/m3 d/m4   # mirrored")]
    Add(LogAddArguments),
    /// Take a volume's write log away (flushes sync the members again).
    #[command(after_help = "Example:
  stripelog log remove d/m0 d/m1 d/m2 d/m3 d/m4")]
    Remove(LogRemoveArguments),
}

#[derive(Args)]
struct InfoArguments {
    #[command(flatten)]
    inspect: InspectArguments,
    /// Each drive's rated endurance in bytes written (TBW), e.g. 600TB: the wear report
    /// then projects the drives' life.
    #[arg(long, value_parser = units::parse_size, conflicts_with = "drive_writes_per_day")]
    drive_tbw: Option<u64>,
    /// Each drive's rating in drive writes per day (of the member size) over
    /// --warranty-years, instead of --drive-tbw.
    #[arg(long)]
    drive_writes_per_day: Option<f64>,
    /// The warranty the rating (--drive-tbw or --drive-writes-per-day) holds for.
    #[arg(long, default_value_t = 5.0)]
    warranty_years: f64,
    /// Client bytes written a day to project from (default: the volume's own average
    /// since it was created), e.g. 2TB.
    #[arg(long, value_parser = units::parse_size)]
    daily_writes: Option<u64>,
}

#[derive(Args)]
struct InspectArguments {
    /// Print JSON for machines.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    degraded: DegradedArgument,
    /// Members in order; `missing` for a lost member.
    #[arg(required = true)]
    members: Vec<PathBuf>,
}

#[derive(Args)]
struct UpgradeArguments {
    #[command(flatten)]
    degraded: DegradedArgument,
    /// Members in order; `missing` for a lost member.
    #[arg(required = true)]
    members: Vec<PathBuf>,
}

/// `--degraded`: what a member path that does not exist means.
#[derive(Args, Clone, Copy)]
pub(crate) struct DegradedArgument {
    /// Open the volume without members whose paths do not exist (as if `missing` were
    /// written in their place). Without it a path that does not exist is an error.
    #[arg(long)]
    degraded: bool,
}

/// `serve --tls`.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsModeArgument {
    Off,
    On,
    Require,
}

#[derive(Args)]
pub(crate) struct ServeArguments {
    /// Unix socket to serve on.
    #[arg(long, default_value = "stripelog.sock")]
    socket: PathBuf,
    /// Serve on TCP instead: PORT (loopback) or ADDRESS:PORT. An address other than
    /// loopback is refused unless --insecure (NBD carries no authentication or encryption
    /// of its own).
    #[arg(long, conflicts_with = "socket")]
    listen: Option<String>,
    /// Serve --listen on an address other than loopback without requiring TLS: whoever
    /// reaches the port can read and write every export.
    #[arg(long, requires = "listen")]
    insecure: bool,
    /// NBD over TLS (STARTTLS): off; on (offered, plain clients served too); require
    /// (every option before STARTTLS is refused, nothing is revealed). Default: require
    /// with --tls-certificates, else off.
    #[arg(long, value_enum)]
    tls: Option<TlsModeArgument>,
    /// Directory with server-cert.pem and server-key.pem (and ca-cert.pem for
    /// --tls-verify-peer): the files qemu's tls-creds-x509 and nbdkit read.
    #[arg(long, value_name = "DIR")]
    tls_certificates: Option<PathBuf>,
    /// Refuse TLS clients without a certificate signed by DIR/ca-cert.pem.
    #[arg(long, requires = "tls_certificates")]
    tls_verify_peer: bool,
    /// Pre-shared keys (nbdkit's --tls-psk): refused, since rustls has no external PSK
    /// yet; use certificates.
    #[arg(long, value_name = "FILE")]
    tls_psk: Option<PathBuf>,
    /// EXPORT=NAME[,NAME...]: only clients whose verified certificate's common name is
    /// listed may open, list or query EXPORT (needs --tls-verify-peer). Repeatable.
    #[arg(long, value_name = "EXPORT=NAME,...", requires = "tls_verify_peer")]
    allow_clients: Vec<String>,
    /// NAME for the volume on MEMBER..., or NAME=MEMBER,MEMBER,... for another volume.
    #[arg(long)]
    export: Vec<String>,
    /// Refuse writes.
    #[arg(long)]
    read_only: bool,
    /// RAM per volume for caching blocks (recent writes and reads).
    #[arg(long, default_value = "256MiB", value_parser = units::parse_size)]
    cache: u64,
    /// RAM per volume for index pages (clean pages beyond it are evicted and read back
    /// from the log when needed); default: the whole index when it fits a quarter of the
    /// machine's memory, else that quarter. More than the machine has is refused.
    #[arg(long, value_parser = units::parse_size)]
    map_cache: Option<u64>,
    /// RAM per volume for sealed batches on their way to the members, in whole stripes (at
    /// most 64): writers wait for a member only when all of it is in flight, so more rides
    /// out longer member stalls (docs/garbage-collection.md, "Pacing"); default 64MiB.
    #[arg(long, value_parser = units::parse_size)]
    write_queue: Option<u64>,
    /// Deduplication's RAM: its sparse index keeps one block name in 2^BITS (the recent
    /// table and runs find the rest). 3, the default, takes 1.31 bytes per physical
    /// block (measured on a 12 GiB data space, docs/deduplication.md); each bit more
    /// halves the sparse index. The served volume's status (control socket) reports
    /// what it takes.
    #[arg(long, value_name = "BITS", default_value_t = stripelog_engine::DEDUP_SAMPLING_BITS_DEFAULT,
          value_parser = clap::value_parser!(u32).range(0..=stripelog_engine::DEDUP_SAMPLING_BITS_MAXIMUM as i64))]
    dedup_sampling_bits: u32,
    /// Control socket for `stripelog status/replace/scrub/set --control` (default:
    /// SOCKET.control when serving on a Unix socket; none on TCP unless given).
    #[arg(long)]
    control: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP at ADDRESS:PORT (or PORT on loopback), path
    /// /metrics: requests, bytes, latency and errors per export and command; cleaning,
    /// space, members, rebuild/scrub progress, the write log.
    #[arg(long, value_name = "ADDRESS:PORT")]
    metrics: Option<String>,
    /// Wait up to DURATION for member paths that do not exist yet (drives still appearing
    /// at boot, /dev/disk/by-id links not made yet), logging which, before opening. Those
    /// still absent then are an error (with --degraded: opened as missing). Given twice,
    /// the last counts. Default: no wait.
    #[arg(long, value_name = "DURATION", value_parser = units::parse_duration, overrides_with = "wait_for_members")]
    wait_for_members: Option<std::time::Duration>,
    #[command(flatten)]
    degraded: DegradedArgument,
    /// Open volumes the superblocks say another host has open and did not close (that
    /// host must be down: two hosts writing one volume destroy it).
    #[arg(long)]
    force: bool,
    /// Open a volume that was not closed cleanly although its write log cannot be read:
    /// the writes acknowledged since its members were last synced are lost.
    #[arg(long)]
    force_without_log: bool,
    /// A fault hook for tests: panic inside the engine's write path, with its write lock
    /// held, once this many client blocks were accepted (how "a bug stops the volume" is
    /// tested end to end). Hidden: never for use on a volume one cares about.
    #[arg(long, hide = true, value_name = "BLOCKS")]
    fault_panic_after_blocks: Option<u64>,
    /// A fault hook for tests: pause this long after each volume opens, before serving, as
    /// a long mount or log replay would (how a signal that arrives while `serve` starts is
    /// tested). Hidden.
    #[arg(long, hide = true, value_name = "DURATION", value_parser = units::parse_duration)]
    fault_pause_after_open: Option<std::time::Duration>,
    /// Members of the (first) exported volume, in order; `missing` for a lost member.
    members: Vec<PathBuf>,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// 4 KiB random writes in process (1 and several threads) on a fresh volume of file
    /// members, as a ratio of the members' own sequential O_DIRECT write bandwidth
    /// measured in the same run; then random reads and the engine's memory per GiB.
    #[command(
        after_help = "Example:\n  stripelog bench engine --dir /var/tmp/sl --members 5 --member-size 8GiB --threads 1,4 --duration 10s --json engine.json"
    )]
    Engine(EngineBenchArguments),
    /// Write saturation (SNIA PTS, seed 004): 4 KiB random writes over the whole of
    /// TARGET, optionally after a sequential fill, IOPS every second, until a written
    /// volume, a time limit or the steady state; a chart against time and bytes written.
    /// Without TARGET: a fresh stripelog volume on file members in --dir, with the
    /// cleaner's amplification and free segments per interval.
    #[command(after_help = SATURATE_EXAMPLES)]
    Saturate(SaturateArguments),
    /// What a volume costs in RAM and how fast it mounts (issue 20): resident memory of an
    /// empty volume of --empty-size logical (sparse members) and of a written one, per TiB;
    /// clean mount and mount after SIGKILL under random writes, from the checkpoint against
    /// scanning every segment, each in its own process.
    #[command(
        after_help = "Example:\n  stripelog bench scale --dir /var/tmp/sl-scale --members 4 --member-size 14GiB --write 40GiB --empty-size 1TiB --json scale.json"
    )]
    Scale(ScaleArguments),
    /// What inline compression (docs/compression.md) would store for the data in files or
    /// block devices: the engine's own LZ4 fragments and packing over every 4 KiB block,
    /// the ratio against storing them whole, and the codec's CPU time per GiB. Reads only.
    #[command(
        after_help = "Examples:\n  stripelog bench compressibility /var/tmp/usr.ext4 /var/tmp/pgbench.ext4\n  stripelog bench compressibility /dev/nvme0n1p3 --json estimate.json"
    )]
    Compressibility(bench::CompressibilityArguments),
    /// How many of the duplicate 4 KiB blocks in files, devices or pipes, read in order as
    /// if written into one volume, deduplication's finder (docs/deduplication.md: sampled
    /// names, runs, a recent table) finds against exact deduplication, and the RAM its
    /// index takes per physical block. Reads only.
    #[command(
        after_help = "Examples:\n  stripelog bench dedupability img0.ext4 img1.ext4 img2.ext4\n  stripelog bench dedupability --capacity 16GiB --sampling-bits 4 pipe0 pipe1 --json found.json"
    )]
    Dedupability(bench::DedupabilityArguments),
    /// One measurement of `bench scale`, in a process of its own (used by it).
    #[command(hide = true)]
    ScaleStep(ScaleStepArguments),
    /// One configurable run on any target: read share, block sizes, queue depth,
    /// threads, time; IOPS, bandwidth and latency percentiles (fio-like JSON).
    #[command(after_help = MIX_EXAMPLES)]
    Mix(bench::MixArguments),
    /// The seeds' test program: random reads and writes × block sizes 512B-4MiB × 1, 10,
    /// 40 threads over a 4 GiB region, the seeds' table and the 70/30 figure.
    #[command(after_help = GRID_EXAMPLES)]
    Grid(bench::GridArguments),
    /// Response time against queue depth (seed 002): a 70/30 mix of 4 KiB and 8 KiB
    /// random requests at depths 1-64; mean, percentiles, maximum, average maximum.
    #[command(after_help = LATENCY_EXAMPLES)]
    Latency(bench::LatencyArguments),
    /// Side by side: 4 KiB random writes and reads on the raw member files, stripelog RAID
    /// on them (in process and over NBD) and an NBD peer; one table with ratios.
    #[command(
        after_help = "Examples:\n  stripelog bench compare --members d/m0,d/m1,d/m2,d/m3,d/m4 --member-size 2GiB --peer 'nbd+unix:///?socket=/tmp/nbdkit.sock'\n  stripelog bench compare --members /dev/sdb,/dev/sdc,/dev/sdd --force --raid 5 --threads 2 --queue-depth 32 --json compare.json"
    )]
    Compare(bench::CompareArguments),
    /// One member made slow (latency spikes on a fraction of its I/O): sequential and
    /// random writes, random read latency, with and without hedged reads and per-member
    /// write queues, against the same volume with no slow member.
    #[command(
        after_help = "Examples:\n  stripelog bench slow-member --members d/m0,d/m1,d/m2,d/m3,d/m4 --member-size 2GiB\n  stripelog bench slow-member --members d/m0,d/m1,d/m2,d/m3,d/m4 --force --spike-latency 20ms --spike-fraction 10% --json slow.json"
    )]
    SlowMember(bench::SlowMemberArguments),
    /// Every figure beside its peer in one run: fresh and steady-state writes, reads, NBD
    /// with one and four connections, durable writes, rebuild, check, compression, dedup,
    /// cores — against fio on the raw members, nbdkit memory and nbdkit file. Runs on
    /// member files, named devices or a testbed of throttled drives; writes report.json,
    /// report.md and SVG charts.
    #[command(after_help = SUITE_EXAMPLES)]
    Suite(bench::SuiteArguments),
}

const SUITE_EXAMPLES: &str = "Examples:\n  stripelog bench suite --dir /var/tmp/sl --member-size 2GiB --output report-files\n  stripelog bench suite --testbed --members 5 --member-size 2GiB --drive-write 100MiB --drive-read 200MiB --output report-testbed\n  stripelog bench suite --devices /dev/sdb,/dev/sdc,/dev/sdd --spare-device /dev/sde --force --parts fresh,steady,rebuild";

/// The target forms of `bench mix` and `bench grid` (a macro: `concat!` takes literals).
macro_rules! target_forms {
    () => {
        "Targets:\n  PATH or file:PATH                 a file or block device (O_DIRECT, io_uring)\n  nbd+unix:///NAME?socket=PATH      an NBD export on a Unix socket\n  nbd://HOST[:PORT]/NAME            an NBD export over TCP (port 10809 by default)\n  engine:MEMBER,MEMBER,...          a stripelog volume, in this process"
    };
}

const MIX_EXAMPLES: &str = concat!(
    "Examples:\n",
    "  stripelog bench mix /var/tmp/f --size 8GiB --queue-depth 32 --duration 10s --json mix.json\n",
    "  stripelog bench mix 'nbd+unix:///stripelog?socket=./stripelog.sock' --read-percent 70 --block-size 4KiB,8KiB --queue-depth 16\n",
    "  stripelog bench mix engine:d/m0,d/m1,d/m2,d/m3,d/m4 --force --threads 4 --zipf 0.8\n\n",
    target_forms!()
);

const LATENCY_EXAMPLES: &str = concat!(
    "Examples:\n",
    "  stripelog bench latency 'nbd+unix:///stripelog?socket=./stripelog.sock' --chart latency.svg\n",
    "  stripelog bench latency /dev/nvme0n1 --force --queue-depths 1,4,16,64 --duration 30s\n",
    "  # durable 4 KiB writes, as fio --fsync=1 (flush) or with FUA:\n",
    "  stripelog bench latency URI --read-percent 0 --block-size 4KiB --durability flush --queue-depths 1,8\n\n",
    target_forms!()
);

const GRID_EXAMPLES: &str = concat!(
    "Examples:\n",
    "  stripelog bench grid /var/tmp/f --size 4GiB --duration 5s --json grid.json\n",
    "  stripelog bench grid nbd://localhost/stripelog --block-sizes 4KiB,64KiB,1MiB --threads 1,10\n\n",
    target_forms!()
);

const SATURATE_EXAMPLES: &str = concat!(
    "Examples:\n",
    "  stripelog bench saturate /dev/nvme0n1 --force --precondition --steady-state --chart nvme.png\n",
    "  stripelog bench saturate 'nbd+unix:///stripelog?socket=./sl.sock' --passes 2 --json nbd.json --chart nbd.svg\n",
    "  stripelog bench saturate --dir /var/tmp/sl --member-size 2GiB --spare 27% --passes 4 --json saturate.json --csv saturate.csv --chart saturate.svg\n\n",
    target_forms!()
);

#[derive(Args)]
struct ScaleArguments {
    /// Directory for the member files (created; files removed afterwards unless --keep).
    #[arg(long, default_value = "stripelog-bench")]
    dir: PathBuf,
    #[arg(long, default_value_t = 4)]
    members: usize,
    #[arg(long, default_value = "14GiB", value_parser = units::parse_size)]
    member_size: u64,
    #[arg(long, default_value = "1MiB", value_parser = units::parse_size)]
    chunk: u64,
    #[arg(long, default_value = "5")]
    raid: String,
    /// Spare fraction of the data space.
    #[arg(long, default_value = "20%", value_parser = units::parse_fraction_ppm)]
    spare: u32,
    /// Bytes written sequentially before the mounts are measured.
    #[arg(long, default_value = "40GiB", value_parser = units::parse_size)]
    write: u64,
    /// Logical size of the empty volume whose memory is measured (sparse members).
    #[arg(long, default_value = "64TiB", value_parser = units::parse_size)]
    empty_size: u64,
    /// How long random writes run before the writer is killed.
    #[arg(long, default_value = "20s", value_parser = units::parse_duration)]
    load: std::time::Duration,
    /// Keep the written volume's member files.
    #[arg(long)]
    keep: bool,
    /// Write over member files that already exist in --dir.
    #[arg(long)]
    force: bool,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct ScaleStepArguments {
    /// open, open-by-scan, open-read-write or load.
    step: String,
    #[arg(long, value_parser = units::parse_size)]
    member_size: u64,
    members: Vec<PathBuf>,
}

#[derive(Args)]
struct SaturateArguments {
    /// What to saturate (see Targets below); without it, a fresh volume in --dir.
    target: Option<String>,
    /// Target: requests in flight per thread.
    #[arg(long, default_value_t = 8)]
    queue_depth: usize,
    /// Target: one sequential pass over the whole target first.
    #[arg(long)]
    precondition: bool,
    /// Target: stop once the IOPS of 5 consecutive intervals are steady by the SNIA rule.
    #[arg(long)]
    steady_state: bool,
    /// Target: create a missing file of this size (sparse).
    #[arg(long, value_parser = units::parse_size)]
    size: Option<u64>,
    /// Allow writing to a target that holds data (its data is overwritten): a file or device
    /// that is not empty, an NBD export with allocated extents, an engine: volume with mapped
    /// blocks; without TARGET, member files that already exist in --dir.
    #[arg(long)]
    force: bool,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Directory for the member files (created; files removed afterwards unless --keep).
    #[arg(long, default_value = "stripelog-bench")]
    dir: PathBuf,
    #[arg(long, default_value_t = 5)]
    members: usize,
    /// Run on these existing files or block devices (comma-separated) instead of files in
    /// --dir: written over and kept; refused when one holds data, unless --force.
    #[arg(long, value_name = "PATHS", value_delimiter = ',')]
    devices: Vec<PathBuf>,
    #[arg(long, default_value = "2GiB", value_parser = units::parse_size)]
    member_size: u64,
    #[arg(long, default_value = "1MiB", value_parser = units::parse_size)]
    chunk: u64,
    #[arg(long, default_value = "5")]
    raid: String,
    /// Spare fraction of the data space.
    #[arg(long, default_value = "27%", value_parser = units::parse_fraction_ppm)]
    spare: u32,
    /// Victim selection: greedy or cost-benefit.
    #[arg(long, default_value_t = stripelog_engine::CleaningPolicy::default())]
    policy: stripelog_engine::CleaningPolicy,
    /// Writer threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Stop after writing this many times the logical size (the target's size)…
    #[arg(long, default_value_t = 4.0)]
    passes: f64,
    /// …or after this long.
    #[arg(long, default_value = "900s", value_parser = units::parse_duration)]
    time_limit: std::time::Duration,
    /// Latency and amplification are reported per interval of this length.
    #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
    interval: std::time::Duration,
    /// The engine's block cache; 0 for none.
    #[arg(long, default_value = "256MiB", value_parser = units::parse_size)]
    cache: u64,
    /// The engine's index page cache (as `serve --map-cache`).
    #[arg(long, value_parser = units::parse_size)]
    map_cache: Option<u64>,
    /// Bytes of sealed batches in flight to the members, in whole stripes (default: the
    /// engine's, 64MiB): more RAM rides out longer member stalls.
    #[arg(long, value_parser = units::parse_size)]
    write_queue: Option<u64>,
    #[arg(long)]
    keep: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the report as JSON to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write IOPS every second as CSV to FILE.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Draw IOPS over time (and latency, or IOPS against bytes written for a TARGET) to
    /// FILE.svg or FILE.png.
    #[arg(long)]
    chart: Option<PathBuf>,
}

#[derive(Args)]
struct EngineBenchArguments {
    /// Directory for the member files (created; files removed afterwards unless --keep).
    #[arg(long, default_value = "stripelog-bench")]
    dir: PathBuf,
    #[arg(long, default_value_t = 5)]
    members: usize,
    /// Run on these existing files or block devices (comma-separated) instead of files in
    /// --dir: written over and kept; refused when one holds data, unless --force.
    #[arg(long, value_name = "PATHS", value_delimiter = ',')]
    devices: Vec<PathBuf>,
    #[arg(long, default_value = "8GiB", value_parser = units::parse_size)]
    member_size: u64,
    #[arg(long, default_value = "1MiB", value_parser = units::parse_size)]
    chunk: u64,
    #[arg(long, default_value = "5")]
    raid: String,
    /// Random I/O goes over the first SIZE of the volume.
    #[arg(long, default_value = "4GiB", value_parser = units::parse_size)]
    region: u64,
    /// Time per phase.
    #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
    duration: std::time::Duration,
    /// Writer thread counts, one phase each.
    #[arg(long, default_value = "1,4", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Reader thread counts, one phase each.
    #[arg(long, default_value = "1,8", value_delimiter = ',')]
    read_threads: Vec<usize>,
    /// Keep the member files.
    #[arg(long)]
    keep: bool,
    /// Allow member files that already exist in --dir (they are overwritten and removed).
    #[arg(long)]
    force: bool,
    /// The engine's block cache (as `serve --cache`); 0 for none.
    #[arg(long, default_value = "256MiB", value_parser = units::parse_size)]
    cache: u64,
    /// The engine's index page cache (as `serve --map-cache`).
    #[arg(long, value_parser = units::parse_size)]
    map_cache: Option<u64>,
    /// Also write the report as JSON to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn parse_raid(text: &str) -> Result<RaidLevel, String> {
    match text.trim().to_ascii_lowercase().trim_start_matches("raid") {
        "0" => Ok(RaidLevel::Raid0),
        "1" | "10" => Ok(RaidLevel::Raid10),
        "5" => Ok(RaidLevel::Raid5),
        "6" => Ok(RaidLevel::Raid6),
        _ => Err(format!("unknown RAID level '{text}': use 0, 1, 10, 5 or 6")),
    }
}

/// Open members by path: `missing` is a missing member, and so is a path that does not
/// exist when `degraded` allows it (otherwise that is an error: a mistyped path must not
/// open the volume degraded and exclude the real member for ever).
fn open_members(
    paths: &[PathBuf],
    create_size_bytes: Option<u64>,
    read_only: bool,
    degraded: bool,
) -> Result<Vec<MemberDevice>, String> {
    if create_size_bytes.is_none() && !degraded {
        refuse_a_count_mismatch(paths)?;
    }
    paths
        .iter()
        .map(|path| {
            let name = path.display().to_string();
            let absent = !path.exists() && std::fs::symlink_metadata(path).is_err();
            if create_size_bytes.is_none() && (name == "missing" || absent) {
                if name != "missing" {
                    if !degraded {
                        return Err(format!(
                            "{name}: no such file or device; write `missing` in its place to open the volume \
                             without this member, or pass --degraded"
                        ));
                    }
                    eprintln!("stripelog: {name} does not exist: opening the volume without it (--degraded)");
                }
                return Ok(MemberDevice { name, device: None });
            }
            let options = FileDeviceOptions { create_size_bytes, read_only, ..FileDeviceOptions::default() };
            let device = FileDevice::open(path, &options).map_err(|error| device_error(&name, error))?;
            Ok(MemberDevice { name, device: Some(Arc::new(device) as Arc<dyn BlockDevice>) })
        })
        .collect()
}

/// When a path given for an existing volume does not exist, look first whether the count
/// is wrong: a member too many (or too few) is a count mismatch, whatever the paths are.
/// Judged from the first member that exists and holds a volume; nothing is written.
fn refuse_a_count_mismatch(paths: &[PathBuf]) -> Result<(), String> {
    let absent = |path: &PathBuf| path.as_os_str() != "missing" && std::fs::symlink_metadata(path).is_err();
    if !paths.iter().any(absent) {
        return Ok(());
    }
    let options = FileDeviceOptions { read_only: true, ..FileDeviceOptions::default() };
    for path in paths.iter().filter(|path| path.as_os_str() != "missing" && path.exists()) {
        let Ok(device) = FileDevice::open(path, &options) else { continue };
        if let Ok(stripelog_engine::identity::DeviceContent::Member(superblock)) =
            stripelog_engine::identity::inspect(&device)
        {
            let recorded = superblock.member_count as usize;
            if recorded != paths.len() {
                return Err(format!(
                    "volume {} has {recorded} members but {} were given ({} says so, as member {})",
                    uuid_text(&superblock.volume_uuid),
                    paths.len(),
                    path.display(),
                    superblock.member_index
                ));
            }
            return Ok(());
        }
    }
    Ok(())
}

fn uuid_text(bytes: &[u8; 16]) -> String {
    bytes.iter().enumerate().fold(String::new(), |mut text, (index, byte)| {
        if matches!(index, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        text.push_str(&format!("{byte:02x}"));
        text
    })
}

/// Before `create` extends an existing member file that is smaller than the member size
/// (a change, however harmless it looks), look at it the way the engine will: one that
/// holds data or a volume is refused now, untouched (docs/data-safety.md).
fn refuse_files_holding_data(paths: &[PathBuf], member_size_bytes: u64) -> Result<(), String> {
    for (index, path) in paths.iter().enumerate() {
        let Ok(metadata) = std::fs::metadata(path) else { continue };
        if !metadata.is_file() || metadata.len() == 0 || metadata.len() >= member_size_bytes {
            continue;
        }
        let name = path.display().to_string();
        let options = FileDeviceOptions { read_only: true, ..FileDeviceOptions::default() };
        let device = FileDevice::open(path, &options).map_err(|error| device_error(&name, error))?;
        let content = stripelog_engine::identity::inspect(&device).map_err(|error| device_error(&name, error))?;
        if let Some(found) = content.found() {
            return Err(engine_error(stripelog_engine::Error::WouldDestroy { member: index, path: name, found }));
        }
    }
    Ok(())
}

fn display_paths(paths: &[PathBuf]) -> String {
    paths.iter().map(|path| path.display().to_string()).collect::<Vec<_>>().join(" and ")
}

/// Format `log_paths` as the write log of the volume on `member_paths` (a missing log
/// file is created with `size_bytes`). A log device that holds data or belongs to a
/// volume is refused unless `force` (docs/data-safety.md). Paths are recorded absolute,
/// so that the volume finds its log from any directory.
fn add_write_log(member_paths: &[PathBuf], log_paths: &[PathBuf], size_bytes: u64, force: bool) -> Result<(), String> {
    if log_paths.len() > stripelog_engine::LOG_MIRRORS_MAXIMUM {
        return Err(format!("a write log has one device, or two for a mirror ({} given)", log_paths.len()));
    }
    let mut logs = Vec::new();
    for path in log_paths {
        let name = path.display().to_string();
        if member_paths.iter().any(|member| member == path) {
            return Err(format!("{name} is a member of the volume: the write log needs a device of its own"));
        }
        let existed = path.exists();
        let options =
            FileDeviceOptions { create_size_bytes: (!existed).then_some(size_bytes), ..FileDeviceOptions::default() };
        let device = FileDevice::open(path, &options).map_err(|error| device_error(&name, error))?;
        if existed && !force {
            let content = stripelog_engine::identity::inspect(&device).map_err(|error| device_error(&name, error))?;
            if content != stripelog_engine::identity::DeviceContent::Empty {
                return Err(format!(
                    "{name} {}: refusing to make it a write log unless forced (--force)",
                    content.describe()
                ));
            }
        }
        let absolute = std::fs::canonicalize(path).map_err(|error| format!("{name}: {error}"))?;
        logs.push(MemberDevice {
            name: absolute.display().to_string(),
            device: Some(Arc::new(device) as Arc<dyn BlockDevice>),
        });
    }
    let members = open_members(member_paths, None, false, false)?;
    Volume::add_write_log(members, logs).map_err(engine_error)
}

/// A member's open error for people: the path once, and who holds it when it is in use.
pub(crate) fn device_error(name: &str, error: stripelog_blockdev::DeviceError) -> String {
    match error {
        stripelog_blockdev::DeviceError::InUse { .. } | stripelog_blockdev::DeviceError::Open { .. } => {
            error.to_string()
        }
        _ => format!("{name}: {error}"),
    }
}

/// Where the index's paging spent its time since the open, with the counts per million
/// client blocks written (docs/index-and-checkpoints.md, "Paging").
fn print_paging(paging: &stripelog_engine::PagingStatus) {
    let per_million = |count: u64| count as f64 * 1e6 / paging.client_blocks_written.max(1) as f64;
    println!(
        "  paging         most pages resident {} of {}; loads {} ({:.0} per M client blocks, {:.1} s; {} ahead), created {}; \
         evicted {}, kept dirty {}, kept used {}, evictor blocked by checkpoints {} and writers {}",
        paging.resident_pages_maximum,
        paging.cache_pages,
        paging.page_loads,
        per_million(paging.page_loads),
        paging.page_load_seconds,
        paging.pages_loaded_ahead,
        paging.pages_created,
        paging.page_evictions,
        paging.evictions_kept_dirty,
        paging.evictions_kept_referenced,
        paging.evictions_blocked_by_checkpoints,
        paging.evictions_blocked_by_writers
    );
    println!(
        "                 checkpoints {} ({:.0} per M client blocks: {} for dirty pages, {} for replay, {} on the \
         interval), {} index pages written ({:.0} per M), {} directory and {} segment table pages, {:.1} s; write lock \
         waited {} times, {:.1} s",
        paging.checkpoints,
        per_million(paging.checkpoints),
        paging.checkpoints_for_dirty_pages,
        paging.checkpoints_for_replay_bytes,
        paging.checkpoints_for_interval,
        paging.checkpoint_index_pages,
        per_million(paging.checkpoint_index_pages),
        paging.checkpoint_directory_pages,
        paging.checkpoint_table_pages,
        paging.checkpoint_seconds,
        paging.write_lock_waits,
        paging.write_lock_wait_seconds
    );
}

fn print_info(stats: &VolumeStats) {
    let state = match (&stats.failure, stats.degraded) {
        (Some(_), _) => "FAILED",
        (None, true) => "DEGRADED",
        (None, false) => "ONLINE",
    };
    println!("volume {}", stats.volume_uuid);
    println!("  state          {state}: survives {} more member failure(s)", stats.failures_still_tolerated);
    println!("  holder         {}", stats.holder.description);
    if let Some(failure) = &stats.failure {
        println!("  failure        {failure}");
    }
    println!(
        "  geometry       {} on {} members, {} data columns, chunk {}, block {}",
        stats.raid_level,
        stats.member_count,
        stats.data_columns,
        format_bytes(stats.chunk_size_bytes as u64),
        format_bytes(stats.block_size_bytes as u64)
    );
    println!(
        "  logical size   {} ({} bytes), spare {:.1} % of {} data capacity",
        format_bytes(stats.logical_size_bytes),
        stats.logical_size_bytes,
        stats.spare_fraction * 100.0,
        format_bytes(stats.data_capacity_bytes)
    );
    if let Some(thin) = &stats.thin_provisioning {
        println!(
            "  thin           holds {} of {} provisioned ({:.1} %){}",
            format_bytes(thin.held_data_bytes),
            format_bytes(thin.provisioned_size_bytes),
            thin.used_fraction * 100.0,
            if thin.used_fraction >= 0.8 {
                ": WARNING, writes beyond the provisioned size fail with ENOSPC"
            } else {
                ""
            }
        );
    }
    let block = stats.block_size_bytes as u64;
    let compressed = stats.compression.as_ref().map_or(0, |compression| compression.fragment_blocks);
    let shared = stats.deduplication.as_ref().map_or(0, |dedup| dedup.shared_logical_blocks);
    println!(
        "  mapped         {} in {} blocks ({} whole, {} compressed, {} shared); {} zero blocks (no media); stored {}",
        format_bytes(stats.blocks_mapped * block),
        stats.blocks_mapped,
        stats.blocks_mapped - compressed - shared,
        compressed,
        shared,
        stats.blocks_zero,
        format_bytes(stats.stored_data_bytes)
    );
    if let Some(compression) = &stats.compression {
        println!(
            "  compression    {} ({:.0} % of blocks offered now); content stored {} in {}: ratio {:.2}; {} \
             blocks compressed",
            compression.setting,
            compression.share * 100.0,
            format_bytes(compression.logical_data_blocks * block),
            format_bytes((compression.physical_data_blocks * block as f64) as u64),
            compression.ratio,
            compression.fragment_blocks
        );
        println!(
            "                 since open: {} compressed (mean fragment {:.0} bytes), {} stored whole as \
             incompressible, {} whole for the CPU",
            compression.blocks_compressed,
            compression.mean_fragment_bytes,
            compression.blocks_whole_incompressible,
            compression.blocks_whole_by_share
        );
    }
    if let Some(dedup) = &stats.deduplication {
        println!(
            "  dedup          {}; {} logical blocks share {} copies ({} compressed, in {}; {} saved): ratio {:.2}; \
             index {} ({:.2} B per physical block, 1 name in {} sampled), shared table {}",
            dedup.setting,
            dedup.shared_logical_blocks,
            dedup.shared_copies,
            dedup.compressed_copies,
            format_bytes(dedup.compressed_copies_sixteenths * block / 16),
            format_bytes(dedup.blocks_saved * block),
            dedup.ratio,
            format_bytes(dedup.index_memory_bytes),
            dedup.index_memory_bytes_per_physical_block,
            1u64 << dedup.sampling_bits,
            format_bytes(dedup.shared_table_memory_bytes)
        );
        println!(
            "                 since open: {} blocks named, duplicates found {} by runs, {} recent, {} by the sparse \
             index, {} within requests; candidates turned away {} by checksum, {} by content",
            dedup.blocks_named,
            dedup.duplicates_by_run,
            dedup.duplicates_by_recent,
            dedup.duplicates_by_sparse,
            dedup.duplicates_within_requests,
            dedup.candidates_rejected_by_checksum,
            dedup.candidates_read_unequal
        );
        println!(
            "                 name index: {} pages ({}) that checkpoints write as they change; since open {} loaded, {} waiting to \
             load, {} unreadable, {} written; candidates read ahead {}, found there {}",
            dedup.name_index_pages,
            format_bytes(dedup.name_index_pages * block),
            dedup.name_index_pages_loaded,
            dedup.name_index_pages_waiting_to_load,
            dedup.name_index_pages_unreadable,
            dedup.name_index_pages_written,
            dedup.candidates_read_ahead,
            dedup.candidates_found_ahead
        );
    }
    println!(
        "  segments       {} used, {} free, {} waiting for a flush, of {}",
        stats.segments_used, stats.segments_free, stats.segments_waiting_for_flush, stats.segments_total
    );
    println!(
        "  since open     clients wrote {}; members written {} (data {}, relocated {}, redundancy {}, metadata {}, \
         padding {})",
        format_bytes(stats.host_bytes_written),
        format_bytes(stats.member_bytes_written),
        format_bytes(stats.member_bytes_data),
        format_bytes(stats.member_bytes_relocated),
        format_bytes(stats.member_bytes_redundancy),
        format_bytes(stats.member_bytes_metadata),
        format_bytes(stats.member_bytes_padding)
    );
    let lifetime = &stats.lifetime;
    let amplification = &stats.lifetime_write_amplification;
    println!(
        "  lifetime       clients wrote {}, read {}; members written {} (data {}, relocated {}, redundancy {}, \
         metadata {}, padding {})",
        format_bytes(lifetime.host_bytes_written),
        format_bytes(lifetime.host_bytes_read),
        format_bytes(
            lifetime.member_bytes_data
                + lifetime.member_bytes_relocated
                + lifetime.member_bytes_redundancy
                + lifetime.member_bytes_metadata
                + lifetime.member_bytes_padding
        ),
        format_bytes(lifetime.member_bytes_data),
        format_bytes(lifetime.member_bytes_relocated),
        format_bytes(lifetime.member_bytes_redundancy),
        format_bytes(lifetime.member_bytes_metadata),
        format_bytes(lifetime.member_bytes_padding),
    );
    println!("                 write amplification {}", describe_write_amplification(amplification));
    println!(
        "                 {} cleaning rounds (write cost {:.2}), {} syncs of the members, {} batches written",
        lifetime.cleaning_rounds, amplification.cleaning_write_cost, lifetime.flushes, lifetime.batches_written
    );
    println!(
        "  memory         map {} ({}-bit entries; {:.1} bytes per logical block with every page resident), \
         checksums {}, write buffers {}",
        format_bytes(stats.map_memory_bytes),
        stats.index_entry_bits,
        stats.map_bytes_per_logical_block,
        format_bytes(stats.checksum_memory_bytes),
        format_bytes(stats.write_buffer_memory_bytes)
    );
    println!(
        "  map cache      {} of {} in use; {} pages read from the log, {} evicted since the open",
        format_bytes(stats.map_cache_used_bytes),
        format_bytes(stats.map_cache_bytes),
        stats.map_page_loads,
        stats.map_page_evictions
    );
    print_paging(&stats.paging);
    match &stats.write_log {
        None => println!("  write log      none: flushes sync the members"),
        Some(log) => {
            let state = if !log.active {
                "FAILED: flushes sync the members"
            } else if log.failed_devices.is_empty() {
                "ONLINE"
            } else {
                "DEGRADED (one mirror left)"
            };
            println!("  write log      {state}, on {}", log.devices.join(" and "));
            println!(
                "                 {} in use of {}; {} records ({}) appended, {} syncs, mean sync {:.1} µs",
                format_bytes(log.used_bytes),
                format_bytes(log.size_bytes),
                log.records_appended,
                format_bytes(log.bytes_appended),
                log.syncs,
                log.mean_sync_microseconds
            );
            for (path, reason) in &log.failed_devices {
                println!("                 failed: {path}: {reason}");
            }
        }
    }
    let recovery = &stats.recovery;
    if recovery.write_log_entries_replayed > 0 {
        println!("  write log      {} entries replayed at this open", recovery.write_log_entries_replayed);
    }
    if recovery.write_log_entries_pending > 0 {
        println!(
            "  write log      {} entries the members lack are not shown (a read-only open does not replay them; \
             open the volume read-write, e.g. serve it, to replay them)",
            recovery.write_log_entries_pending
        );
    }
    println!(
        "  mount          {} segments scanned, {} batches replayed, {} verified, {} discarded, {} shards repaired in {:.3} s",
        recovery.segments_scanned,
        recovery.batches_replayed,
        recovery.tail_batches_verified,
        recovery.batches_discarded,
        recovery.shards_repaired,
        recovery.seconds
    );
    println!("  members");
    for member in &stats.members {
        let state = match member.state.as_str() {
            "active" => "ONLINE    ",
            "rebuilding" => "REBUILDING",
            _ => "MISSING   ",
        };
        println!("    {:>2}  {state}  {}  {}", member.index, member.name, member.description);
        if !member.member_uuid.is_empty() {
            println!("        member UUID {}", member.member_uuid);
        }
    }
    for retired in &stats.retired_members {
        println!(
            "    retired: member {} replaced on {}: its old device (member UUID {}) is refused if offered again",
            retired.position,
            stripelog_engine::identity::format_unix_seconds(retired.retired_unix_seconds),
            retired.member_uuid
        );
    }
}

fn print_check(report: &CheckReport) {
    println!(
        "checked {} batches, {} blocks in {} segments: {} of member rows read in {:.1} s ({}/s)",
        report.batches_checked,
        report.blocks_checked,
        report.segments_scanned,
        crate::units::format_bytes(report.bytes_read),
        report.seconds,
        crate::units::format_bytes((report.bytes_read as f64 / report.seconds.max(1e-9)) as u64)
    );
    println!("  damaged blocks rebuildable from redundancy: {}", report.blocks_repairable);
    println!("  damaged blocks that cannot be rebuilt:      {}", report.blocks_unrecoverable);
    println!("  stripe rows with bad parity or mirror:      {}", report.rows_with_bad_redundancy);
    if report.fragments_checked > 0 || report.fragments_damaged > 0 {
        println!(
            "  compressed fragments decompressed:          {} ({} not the block written)",
            report.fragments_checked, report.fragments_damaged
        );
    }
    if report.shared_records_checked > 0 || report.shared_references_to_free_records > 0 {
        println!(
            "  shared copies whose references were counted: {} ({} miscounted, {} references to free records)",
            report.shared_records_checked,
            report.shared_records_miscounted.len(),
            report.shared_references_to_free_records
        );
    }
    println!(
        "  counts recounted from the index:            {}",
        if report.counts_miscounted.is_empty() {
            "agree".to_string()
        } else {
            format!("{} differ", report.counts_miscounted.len())
        }
    );
    for (count, recounted, reported) in &report.counts_miscounted {
        println!("    MISCOUNTED {count}: the index holds {recounted}, the volume reports {reported}");
    }
    if report.unclean_shutdown {
        println!("  the volume was not closed cleanly; what the crash left, which the next read-write open repairs:");
        println!("    blocks of stripes torn after the last durable point: {}", report.blocks_torn_by_crash);
        println!("    parity rows of those stripes:                        {}", report.rows_torn_by_crash);
        println!("    batches after the end of the log (unflushed, lost):  {}", report.batches_after_log_end);
    } else if report.batches_after_log_end > 0 {
        println!("  batches after the end of the log (unflushed writes of a crash): {}", report.batches_after_log_end);
    }
    if report.write_log_entries_pending > 0 {
        println!(
            "  write log entries the members lack (the next read-write open replays them): {}",
            report.write_log_entries_pending
        );
    }
    if !report.members_not_redundant.is_empty() {
        let members: Vec<String> = report.members_not_redundant.iter().map(usize::to_string).collect();
        println!("  members missing, failed or rebuilding: {}", members.join(", "));
    }
    if !report.logical_blocks_unrecoverable.is_empty() {
        let shown: Vec<String> = report.logical_blocks_unrecoverable.iter().take(32).map(u64::to_string).collect();
        println!("  unreadable logical blocks (4 KiB): {}", shown.join(", "));
    }
    let status = report.status();
    let verdict = if status == 0 {
        "clean".to_string()
    } else if status & stripelog_engine::check_status::UNREPAIRABLE_DAMAGE != 0 {
        "DAMAGED: data is lost (exit status bit 4)".to_string()
    } else if status & stripelog_engine::check_status::REPAIRABLE_DAMAGE != 0 {
        "DAMAGED, repairable from redundancy: run `stripelog scrub` or replace the missing members (exit status bit 2)"
            .to_string()
    } else {
        "clean apart from an unclean shutdown's leftovers, which the next read-write open repairs (exit status 1)"
            .to_string()
    };
    println!("{verdict}");
}

/// Write amplification for people: the total per client byte and its parts.
pub(crate) fn describe_write_amplification(amplification: &stripelog_engine::WriteAmplification) -> String {
    format!(
        "{:.2} (member bytes per client byte) = data {:.2} + cleaning {:.2} + redundancy {:.2} + metadata {:.2} + \
         padding {:.2}",
        amplification.total,
        amplification.data,
        amplification.cleaning,
        amplification.redundancy,
        amplification.metadata,
        amplification.padding
    )
}

/// The wear part of `info`, in the terms of the seeds.
fn print_wear(wear: &wear::WearReport) {
    println!("  wear           write amplification {}", describe_write_amplification(&wear.write_amplification));
    println!(
        "                 {} written by clients in {}; {} a day ({})",
        format_bytes(wear.host_bytes_written),
        units::format_seconds(wear.volume_age_days * 86_400.0),
        format_bytes(wear.host_bytes_per_day as u64),
        wear.host_bytes_per_day_basis
    );
    match (wear.rated_bytes_per_drive, wear.safe_overwrites_per_day) {
        (Some(rated), Some(overwrites)) => println!(
            "                 rated {} per drive: {overwrites:.2} safe overwrites of the volume a day; projected life {}",
            format_bytes(rated as u64),
            wear.projected_life_years
                .map_or_else(|| "unknown (no writes a day to project from)".to_string(), |years| format!("{years:.1} years"))
        ),
        _ => println!("                 (give --drive-tbw or --drive-writes-per-day for the drives' projected life)"),
    }
    for member in &wear.members {
        let rated = match (member.endurance_used_fraction, member.projected_life_years) {
            (Some(used), Some(years)) => format!(", {:.4} % of its endurance, {years:.1} years left", used * 100.0),
            (Some(used), None) => format!(", {:.4} % of its endurance", used * 100.0),
            _ => String::new(),
        };
        println!(
            "    member {:>2}   {} written{rated}  {}",
            member.index,
            format_bytes(member.lifetime_bytes_written),
            member.name
        );
    }
}

fn show_info(stats: &VolumeStats, json: bool) -> Result<(), String> {
    if json {
        print_json(stats)
    } else {
        print_info(stats);
        Ok(())
    }
}

fn print_json<T: serde::Serialize>(value: &T) -> Result<(), String> {
    println!("{}", serde_json::to_string_pretty(value).map_err(|error| error.to_string())?);
    Ok(())
}

/// `--json FILE` of the benchmarks and experiments: the report, pretty-printed, if asked.
fn write_json_file<T: serde::Serialize>(path: Option<&std::path::Path>, value: &T) -> Result<(), String> {
    if let Some(path) = path {
        let text = serde_json::to_string_pretty(value).map_err(|error| error.to_string())?;
        std::fs::write(path, text).map_err(|error| format!("{}: {error}", path.display()))?;
    }
    Ok(())
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    match cli.command {
        Command::Create(arguments) => create::create(arguments),
        Command::Log(LogCommand::Add(arguments)) => {
            add_write_log(&arguments.members, &arguments.devices, arguments.size, arguments.force)?;
            println!("write log added on {}", display_paths(&arguments.devices));
            Ok(ExitCode::SUCCESS)
        }
        Command::Log(LogCommand::Remove(arguments)) => {
            let members = open_members(&arguments.members, None, false, false)?;
            match Volume::remove_write_log(members).map_err(engine_error)? {
                Some(paths) => println!("write log on {} removed: flushes sync the members", paths.join(" and ")),
                None => println!("the volume has no write log"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Info(arguments) => {
            let inspect = &arguments.inspect;
            let volume = open_read_only(&inspect.members, inspect.degraded)?;
            let stats = volume.stats();
            let warranty_years = arguments.warranty_years;
            if !(warranty_years.is_finite() && warranty_years > 0.0) {
                return Err(format!("--warranty-years must be above zero, got {warranty_years}"));
            }
            let endurance = match (arguments.drive_tbw, arguments.drive_writes_per_day) {
                (Some(0), _) => return Err("--drive-tbw must be above zero".into()),
                (Some(bytes), _) => Some(wear::Endurance::BytesWritten { bytes: bytes as f64, warranty_years }),
                (None, Some(drive_writes_per_day)) => {
                    if !(drive_writes_per_day.is_finite() && drive_writes_per_day > 0.0) {
                        return Err(format!("--drive-writes-per-day must be above zero, got {drive_writes_per_day}"));
                    }
                    Some(wear::Endurance::DriveWritesPerDay { drive_writes_per_day, warranty_years })
                }
                (None, None) => None,
            };
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|elapsed| elapsed.as_secs())
                .unwrap_or(0);
            let wear = wear::report(&stats, endurance, arguments.daily_writes.map(|bytes| bytes as f64), now);
            if inspect.json {
                let mut value = serde_json::to_value(&stats).map_err(|error| error.to_string())?;
                value["wear"] = serde_json::to_value(&wear).map_err(|error| error.to_string())?;
                print_json(&value)?;
            } else {
                print_info(&stats);
                print_wear(&wear);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Check(arguments) => {
            let operational = |message: String| {
                eprintln!("stripelog: {message}");
                ExitCode::from(stripelog_engine::check_status::OPERATIONAL_ERROR)
            };
            let volume = match open_read_only(&arguments.members, arguments.degraded) {
                Ok(volume) => volume,
                Err(message) => return Ok(operational(message)),
            };
            let bar = spinner("verifying every live block and parity row");
            let report = volume.check().map_err(|error| error.to_string());
            bar.finish_and_clear();
            let report = match report {
                Ok(report) => report,
                Err(message) => return Ok(operational(message)),
            };
            if arguments.json {
                print_json(&report)?;
            } else {
                print_check(&report);
            }
            Ok(ExitCode::from(report.status()))
        }
        Command::Upgrade(arguments) => upgrade(arguments),
        Command::Serve(arguments) => serve::serve(arguments),
        Command::Replace(arguments) => maintenance::replace(arguments),
        Command::Scrub(arguments) => maintenance::scrub(arguments),
        Command::Set(arguments) => maintenance::set(arguments),
        Command::Status(arguments) => maintenance::status(arguments),
        Command::Top(arguments) => maintenance::top(arguments),
        Command::Bench(BenchCommand::Engine(arguments)) => bench_engine(arguments),
        Command::Bench(BenchCommand::Saturate(arguments)) => bench_saturate(arguments),
        Command::Bench(BenchCommand::Scale(arguments)) => bench_scale(arguments),
        Command::Bench(BenchCommand::ScaleStep(arguments)) => {
            stripelog_bench::scale::step(&arguments.step, &arguments.members, arguments.member_size)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(BenchCommand::Mix(arguments)) => bench::mix(arguments),
        Command::Bench(BenchCommand::Compressibility(arguments)) => bench::compressibility(arguments),
        Command::Bench(BenchCommand::Dedupability(arguments)) => bench::dedupability(arguments),
        Command::Bench(BenchCommand::Grid(arguments)) => bench::grid(arguments),
        Command::Bench(BenchCommand::Latency(arguments)) => bench::latency(arguments),
        Command::Bench(BenchCommand::Compare(arguments)) => bench::compare(arguments),
        Command::Bench(BenchCommand::SlowMember(arguments)) => bench::slow_member(arguments),
        Command::Bench(BenchCommand::Suite(arguments)) => bench::suite(arguments),
        Command::Sim(SimCommand::Gc(arguments)) => sim_gc(arguments),
        Command::Sim(SimCommand::Overprovisioning(arguments)) => {
            sim::overprovisioning(arguments).map(|()| ExitCode::SUCCESS)
        }
        Command::Sim(SimCommand::LameRaid(arguments)) => sim::lame_raid(arguments).map(|()| ExitCode::SUCCESS),
        Command::Sim(SimCommand::Wear(arguments)) => sim::wear(arguments).map(|()| ExitCode::SUCCESS),
        Command::Plan(arguments) => plan::run(arguments).map(|()| ExitCode::SUCCESS),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "stripelog", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Manpages { directory } => {
            std::fs::create_dir_all(&directory).map_err(|error| format!("{}: {error}", directory.display()))?;
            let command = <Cli as clap::CommandFactory>::command();
            clap_mangen::generate_to(command, &directory)
                .map_err(|error| format!("{}: {error}", directory.display()))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn sim_gc(arguments: GcSimArguments) -> Result<ExitCode, String> {
    let options = stripelog_bench::gc::Options {
        workload: arguments.workload,
        spare_fraction: arguments.spare as f64 / 1e6,
        policy: arguments.policy,
        separate_streams: !arguments.no_separation,
        client_write_pairs: !arguments.one_client_stream,
        segment_count: arguments.segments,
        chunk_size_bytes: chunk_size(arguments.chunk)?,
        overwrite_passes: arguments.passes,
        seed: arguments.seed,
        ..Default::default()
    };
    let bar = spinner("starting");
    let report = stripelog_bench::gc::run(&options, &|line| bar.set_message(line.to_string()));
    bar.finish_and_clear();
    let report = report?;
    println!(
        "workload {} spare {:.0} % policy {}{}: {} segments of {} blocks, {} writes ({} measured) in {:.1} s",
        report.workload,
        report.spare_fraction * 100.0,
        report.policy,
        match (report.separate_streams, report.client_write_pairs) {
            (false, _) => " (one log, no separation)",
            (true, false) => " (one client stream)",
            (true, true) => "",
        },
        report.segment_count,
        report.blocks_per_segment,
        report.writes,
        report.measured_writes,
        report.seconds
    );
    let reference = report
        .reference_greedy_uniform
        .map(|figure| format!("  (analytic greedy, large segments: {figure:.2})"))
        .unwrap_or_default();
    println!("write_amplification {:.3}{reference}", report.write_amplification);
    if report.client_write_pairs {
        println!("client writes placed in the cold stream {:.1} %", report.cold_write_share * 100.0);
    }
    let for_data = report
        .reference_greedy_uniform_for_data
        .map(|figure| format!(" (analytic greedy there: {figure:.2})"))
        .unwrap_or_default();
    println!(
        "spare fraction left once the cleaning reserve is taken {:.2} %{for_data}",
        report.spare_fraction_for_data * 100.0
    );
    if let Some(bound) = report.reference_two_pool {
        println!(
            "two-pool bound (hot and cold perfectly separated, each cleaned greedily, at the nominal spare) {bound:.3}; measured ÷ bound {:.3}",
            report.write_amplification / bound
        );
    }
    println!(
        "summaries {:.2} % and padding {:.2} % of the positions written; total amplification with RAID-5 parity {:.3}",
        report.summary_share * 100.0,
        report.padding_share * 100.0,
        report.total_amplification
    );
    write_json_file(arguments.json.as_deref(), &report)?;
    Ok(ExitCode::SUCCESS)
}

/// A spinner on stderr for long work; indicatif draws nothing when stderr is not a TTY.
fn spinner(message: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed}] {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar.set_message(message.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

fn open_read_only(paths: &[PathBuf], degraded: DegradedArgument) -> Result<Volume, String> {
    let members = open_members(paths, None, true, degraded.degraded)?;
    let options = OpenOptions { read_only: true, flush_interval: None, ..OpenOptions::default() };
    let bar = spinner("reading segment summaries");
    let volume = Volume::open(members, &options).map_err(engine_error);
    bar.finish_and_clear();
    volume
}

fn upgrade(arguments: UpgradeArguments) -> Result<ExitCode, String> {
    let open = |upgrade_format: bool| -> Result<stripelog_engine::Result<Volume>, String> {
        let members = open_members(&arguments.members, None, false, arguments.degraded.degraded)?;
        let options = OpenOptions {
            upgrade_format,
            flush_interval: None,
            holder_program: "stripelog upgrade".into(),
            ..OpenOptions::default()
        };
        let bar = spinner("reading segment summaries");
        let volume = Volume::open(members, &options);
        bar.finish_and_clear();
        Ok(volume)
    };
    // The refusal names the version before anything is read beyond the superblocks; a
    // volume that opens without it is current already.
    let from = match open(false)? {
        Ok(volume) => {
            let version = volume.stats().superblock_version;
            volume.close().map_err(engine_error)?;
            println!("already at format version {version}: nothing to do");
            return Ok(ExitCode::SUCCESS);
        }
        Err(stripelog_engine::Error::FormatUpgradeNeeded { version, .. }) => version,
        Err(error) => return Err(engine_error(error)),
    };
    let volume = open(true)?.map_err(engine_error)?;
    let to = volume.stats().superblock_version;
    volume.close().map_err(engine_error)?;
    println!("upgraded from format version {from} to {to}");
    Ok(ExitCode::SUCCESS)
}

/// An engine error as the CLI reports it: with the flag that gets past a refusal.
pub(crate) fn engine_error(error: stripelog_engine::Error) -> String {
    match error {
        stripelog_engine::Error::WouldDestroy { .. } => format!("{error} (pass --force to overwrite it)"),
        stripelog_engine::Error::HeldByAnotherHost { .. } => {
            format!("{error} (stripelog serve --force, once you are sure)")
        }
        _ => error.to_string(),
    }
}

/// A chunk size from the command line as the engine takes it.
fn chunk_size(bytes: u64) -> Result<u32, String> {
    u32::try_from(bytes).map_err(|_| "chunk size is too large".to_string())
}

fn bench_scale(arguments: ScaleArguments) -> Result<ExitCode, String> {
    let options = stripelog_bench::scale::Options {
        directory: arguments.dir,
        members: arguments.members,
        member_size_bytes: arguments.member_size,
        raid_level: parse_raid(&arguments.raid)?,
        chunk_size_bytes: u32::try_from(arguments.chunk).map_err(|_| "--chunk is too large".to_string())?,
        spare_ppm: arguments.spare,
        write_bytes: arguments.write,
        load: arguments.load,
        empty_logical_bytes: arguments.empty_size,
        program: std::env::current_exe().map_err(|error| error.to_string())?,
        keep: arguments.keep,
        force: arguments.force,
    };
    let bar = spinner("bench scale");
    let report = stripelog_bench::scale::run(&options, &|message| bar.set_message(message.to_string()))?;
    bar.finish_and_clear();
    print!("{}", stripelog_bench::scale::describe(&report));
    if let Some(path) = &arguments.json {
        let text = serde_json::to_string_pretty(&report).map_err(|error| error.to_string())?;
        std::fs::write(path, text).map_err(|error| format!("{}: {error}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn bench_saturate(arguments: SaturateArguments) -> Result<ExitCode, String> {
    if let Some(target) = &arguments.target {
        return bench::saturate_target(&bench::SaturateTarget {
            target: target.clone(),
            size: arguments.size,
            force: arguments.force,
            threads: arguments.threads,
            queue_depth: arguments.queue_depth,
            precondition: arguments.precondition,
            steady_state: arguments.steady_state,
            passes: arguments.passes,
            time_limit: arguments.time_limit,
            round: arguments.interval,
            seed: arguments.seed,
            json: arguments.json.clone(),
            csv: arguments.csv.clone(),
            chart: arguments.chart.clone(),
            quiet: arguments.quiet,
        });
    }
    if let Some(path) = &arguments.chart {
        stripelog_bench::chart::check(path)?;
    }
    let options = stripelog_bench::saturate::Options {
        directory: arguments.dir,
        member_count: arguments.members,
        member_size_bytes: arguments.member_size,
        chunk_size_bytes: chunk_size(arguments.chunk)?,
        raid_level: parse_raid(&arguments.raid)?,
        spare_ppm: arguments.spare,
        policy: arguments.policy,
        threads: arguments.threads,
        overwrite_passes: arguments.passes,
        duration_limit: arguments.time_limit,
        interval: arguments.interval,
        cache_size_bytes: arguments.cache,
        map_cache_bytes: arguments.map_cache,
        write_queue_bytes: arguments.write_queue,
        keep_files: arguments.keep,
        devices: arguments.devices,
        force: arguments.force,
        seed: arguments.seed,
    };
    let bar = spinner("starting");
    let report = stripelog_bench::saturate::run(&options, &|line| bar.set_message(line.trim().to_string()));
    bar.finish_and_clear();
    let report = report?;
    println!(
        "stripelog write saturation: {} × {} members ({}), chunk {}, spare {:.0} %, {} cleaning, {} thread(s)",
        report.raid_level,
        report.member_count,
        format_bytes(report.member_size_bytes),
        format_bytes(report.chunk_size_bytes as u64),
        report.spare_fraction * 100.0,
        report.policy,
        report.threads
    );
    println!(
        "logical {} filled in {:.1} s; then {} 4 KiB random writes ({:.2} × logical) in {:.1} s",
        format_bytes(report.logical_size_bytes),
        report.fill_seconds,
        report.writes,
        report.writes as f64 * 4096.0 / report.logical_size_bytes as f64,
        report.seconds
    );
    println!(
        "{:>9} {:>10} {:>9} {:>9} {:>9} {:>7} {:>6} {:>7} {:>8} {:>17} {:>17}",
        "seconds",
        "IOPS",
        "p50 µs",
        "p99 µs",
        "max ms",
        "WA",
        "free",
        "rounds",
        "paced",
        "buffer stalls, s",
        "space stalls, s"
    );
    for interval in &report.intervals {
        println!(
            "{:>9} {:>10.0} {:>9.0} {:>9.0} {:>9.1} {:>7.2} {:>6} {:>7} {:>8} {:>9} {:>7.2} {:>9} {:>7.2}",
            stripelog_bench::saturation::span_label(interval.start_seconds, interval.length_seconds),
            interval.iops,
            interval.latency_p50_ns as f64 / 1e3,
            interval.latency_p99_ns as f64 / 1e3,
            interval.latency_max_ns as f64 / 1e6,
            interval.write_amplification,
            interval.segments_free_at_end,
            interval.cleaning_rounds,
            interval.paced_writes,
            interval.writes_stalled_for_buffers,
            interval.buffer_stall_seconds,
            interval.writes_stalled_for_space,
            interval.space_stall_seconds
        );
    }
    match &report.steady_state {
        Some(steady) => println!("{}", steady.describe(report.intervals[steady.first_interval].start_seconds)),
        None => println!("no steady state by the SNIA rule; the ratio below uses the last 5 intervals"),
    }
    println!(
        "members' sequential O_DIRECT bandwidth (all at once), before and after the run: write {:.0} and {}, read {:.0} and {:.0} MB/s; the ratios use {} (the steady state overwrites, and reads old blocks)",
        report.sequential_write_bytes_per_second_before / 1e6,
        report
            .sequential_write_bytes_per_second_after
            .map_or("not measured (the files are kept)".to_string(), |after| format!("{:.0}", after / 1e6)),
        report.sequential_read_bytes_per_second_before / 1e6,
        report.sequential_read_bytes_per_second_after / 1e6,
        if report.sequential_write_bytes_per_second_after.is_some() {
            "those after the run"
        } else {
            "the read after the run and the write before it"
        }
    );
    println!(
        "steady IOPS × 4 KiB ÷ (members' sequential {:.0} MB/s × data fraction {:.2}) = {:.3}",
        report.sequential_write_bytes_per_second / 1e6,
        report.data_fraction,
        report.ratio_to_sequential
    );
    println!(
        "steady IOPS ÷ the cleaner's traffic bound {:.0} IOPS (at WA {:.2}: WA × 4 KiB written with parity at {:.0} MB/s, (WA − 1) × 4 KiB read at {:.0} MB/s) = {:.3}",
        report.cleaner_bound_iops,
        report.write_amplification,
        report.sequential_write_bytes_per_second / 1e6,
        report.sequential_read_bytes_per_second / 1e6,
        report.ratio_to_cleaner_bound
    );
    println!(
        "the cleaner read {:.2} bytes per live byte it relocated (whole spans of rows); with those reads the bound is {:.0} IOPS: steady IOPS ÷ it = {:.3}",
        report.cleaner_read_per_relocated_byte, report.span_read_bound_iops, report.ratio_to_span_read_bound
    );
    println!(
        "write_amplification (cleaning, second half) {:.3}; total with parity and summaries {:.3}; latency p99 {:.0} µs, max {:.1} ms",
        report.write_amplification,
        report.write_amplification_total,
        report.latency_p99_ns as f64 / 1e3,
        report.latency_max_ns as f64 / 1e6
    );
    println!(
        "client writes paced to the cleaner (docs/garbage-collection.md, \"Pacing\"): {} of {}, {:.1} s of waiting in all",
        report.paced_writes, report.writes, report.paced_seconds
    );
    println!(
        "writes that stalled: {} waiting for a write buffer (the members), {:.1} s in all; {} waiting for a free segment (the cleaner), {:.1} s in all",
        report.writes_stalled_for_buffers,
        report.buffer_stall_seconds,
        report.writes_stalled_for_space,
        report.space_stall_seconds
    );
    println!(
        "batches: {} whole stripes, {} short (sealed early: flushes, the cleaner's batches); at most {} in flight, \
         each holding a whole stripe's buffers",
        report.full_stripes, report.short_stripes, report.write_queue_batches
    );
    println!("{}", report.map_cache.describe());
    write_json_file(arguments.json.as_deref(), &report)?;
    if let Some(path) = &arguments.csv {
        let mut text = String::from("second,iops\n");
        for (second, iops) in report.iops_per_second.iter().enumerate() {
            text.push_str(&format!("{},{iops:.0}\n", second + 1));
        }
        std::fs::write(path, text).map_err(|error| format!("{}: {error}", path.display()))?;
    }
    if let Some(path) = &arguments.chart {
        stripelog_bench::saturate::chart(&report, path)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn bench_engine(arguments: EngineBenchArguments) -> Result<ExitCode, String> {
    let options = stripelog_bench::engine::Options {
        directory: arguments.dir,
        member_count: arguments.members,
        member_size_bytes: arguments.member_size,
        chunk_size_bytes: chunk_size(arguments.chunk)?,
        raid_level: parse_raid(&arguments.raid)?,
        region_bytes: arguments.region,
        duration: arguments.duration,
        write_thread_counts: arguments.threads,
        read_thread_counts: arguments.read_threads,
        keep_files: arguments.keep,
        devices: arguments.devices,
        force: arguments.force,
        cache_size_bytes: arguments.cache,
        map_cache_bytes: arguments.map_cache,
    };
    let bar = spinner("starting");
    let report = stripelog_bench::engine::run(&options, &|line| {
        if bar.is_hidden() {
            eprintln!("{line}");
        } else {
            bar.println(line);
            bar.set_message(line.trim().to_string());
        }
    });
    bar.finish_and_clear();
    let report = report?;
    println!(
        "stripelog engine benchmark: {} × {} members ({}), chunk {}, 4 KiB random I/O over {}",
        report.raid_level,
        report.member_count,
        format_bytes(report.member_size_bytes),
        format_bytes(report.chunk_size_bytes as u64),
        format_bytes(report.region_bytes)
    );
    println!(
        "members' sequential O_DIRECT write bandwidth (all members at once): {:.0} MB/s before, {:.0} MB/s after the writes; ratios use {:.0} MB/s; data fraction {:.2}",
        report.sequential_write_bytes_per_second_before / 1e6,
        report.sequential_write_bytes_per_second_after / 1e6,
        report.sequential_write_bytes_per_second / 1e6,
        report.data_fraction
    );
    println!("{:<14} {:>8} {:>12} {:>10} {:>8}", "phase", "threads", "IOPS", "MB/s", "ratio");
    for phase in &report.random_write {
        println!(
            "{:<14} {:>8} {:>12.0} {:>10.1} {:>8.2}{}",
            "random write",
            phase.threads,
            phase.iops,
            phase.bytes_per_second / 1e6,
            phase.ratio_to_sequential.unwrap_or(0.0),
            if phase.stopped_by_space_budget { "  (stopped at the space budget)" } else { "" }
        );
    }
    for phase in &report.random_read {
        println!(
            "{:<14} {:>8} {:>12.0} {:>10.1} {:>8}",
            "random read",
            phase.threads,
            phase.iops,
            phase.bytes_per_second / 1e6,
            ""
        );
    }
    println!("ratio = write IOPS × 4 KiB ÷ (sequential bandwidth × data fraction); bar 0.6, goal 0.9");
    println!(
        "engine memory: {:.2} MiB per logical GiB (map {:.1} bytes per 4 KiB block resident, checksums, write buffers, {} cache){}",
        report.engine_memory_bytes_per_logical_gib / (1 << 20) as f64,
        report.map_bytes_per_logical_block,
        format_bytes(report.cache_size_bytes),
        report
            .resident_memory_bytes_per_logical_gib
            .map(|bytes| format!("; process resident growth {:.2} MiB per logical GiB", bytes / (1 << 20) as f64))
            .unwrap_or_default()
    );
    println!("{}", report.map_cache.describe());
    write_json_file(arguments.json.as_deref(), &report)?;
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    // SAFETY: called first thing in main, before any thread starts; restoring the default
    // action makes `stripelog info | head` end quietly like other Unix tools instead of
    // panicking on a closed pipe.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    logging::init(cli.log_level);
    match run(cli) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("stripelog: {message}");
            ExitCode::from(2)
        }
    }
}
