//! The suite's parts: each runs stripelog's own commands and, in the same run, the peer
//! that says what the figure should be measured against.

use super::process::{self, Server, Words};
use super::{ArraySpeed, Figure, MemberSpeed, Options, Part, PartReport};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Instant;

const BLOCK_BYTES: f64 = 4096.0;
/// Share of the logical space a part fills before it reads, rebuilds or checks.
const FILL_SHARE: f64 = 0.7;
/// The steady-state bars of issue 58: IOPS ÷ the cleaner's traffic bound, and the largest
/// write latency of a 10 s interval.
const STEADY_BAR: f64 = 0.85;
const STEADY_GOAL: f64 = 0.95;
const STEADY_LATENCY_BAR_MILLISECONDS: f64 = 20.0;
/// The index part's map caches, as shares of the whole index (issue 57), and its bars:
/// steady-state random writes at a quarter and a tenth ÷ with the whole index (goals
/// beside), Zipf(0.99) writes at a tenth, cache-off random reads at a quarter.
const INDEX_CACHE_SHARES: [(&str, f64); 4] =
    [("the whole index", 1.0), ("a half", 0.5), ("a quarter", 0.25), ("a tenth", 0.1)];
const INDEX_QUARTER_BAR: (f64, f64) = (0.7, 0.9);
const INDEX_TENTH_BAR: (f64, f64) = (0.5, 0.7);
const INDEX_ZIPF_TENTH_BAR: f64 = 0.85;
const INDEX_READS_QUARTER_BAR: f64 = 0.7;

/// A part's figure is "limited by the cores" when the machine was this busy during it.
const CORES_LIMIT_SHARE: f64 = 0.9;
/// …and "limited by the drives" when it reached this share of their own bound.
const DRIVES_LIMIT_SHARE: f64 = 0.85;

/// A volume on the members with data written over `bytes` from its start.
#[derive(Clone)]
struct Filled {
    bytes: u64,
}

pub struct Context<'a> {
    options: &'a Options,
    members: Vec<PathBuf>,
    spare: Option<PathBuf>,
    work: PathBuf,
    progress: &'a dyn Fn(&str),
    array: ArraySpeed,
    filled: Option<Filled>,
    /// Notes and charts of the part that runs now.
    notes: Vec<String>,
    charts: Vec<String>,
}

impl<'a> Context<'a> {
    pub fn new(
        options: &'a Options,
        members: Vec<PathBuf>,
        spare: Option<PathBuf>,
        progress: &'a dyn Fn(&str),
    ) -> Self {
        Context {
            options,
            members,
            spare,
            work: options.output.join("work"),
            progress,
            array: ArraySpeed::default(),
            filled: None,
            notes: Vec::new(),
            charts: Vec::new(),
        }
    }

    fn seconds(&self) -> u64 {
        self.options.cell.as_secs().max(1)
    }

    fn log(&self, name: &str) -> PathBuf {
        self.work.join(format!("{name}.log"))
    }

    fn stripelog(&self) -> Words {
        Words::new(&self.options.stripelog)
    }

    fn member_list(&self, separator: &str) -> String {
        self.members.iter().map(|path| path.display().to_string()).collect::<Vec<_>>().join(separator)
    }

    fn data_share(&self) -> f64 {
        (self.members.len() - 1) as f64 / self.members.len() as f64
    }

    /// Run fio with `arguments`, its JSON report in work/NAME.json.
    fn fio(&self, name: &str, arguments: Vec<String>) -> Result<(Value, String), String> {
        let json = self.work.join(format!("{name}.json"));
        let words =
            Words::new("fio").arg("--output-format=json").arg(format!("--output={}", json.display())).args(arguments);
        process::run(&words, &self.log(name))?;
        let text = std::fs::read_to_string(&json).map_err(|error| format!("{}: {error}", json.display()))?;
        let value = process::parse_json(&text).map_err(|error| format!("{}: {error}", json.display()))?;
        Ok((value, words.text()))
    }

    fn run_json(&self, name: &str, words: &Words) -> Result<Value, String> {
        process::run_json(words, &self.log(name))
    }

    /// Run a stripelog command that writes its JSON report to work/NAME.json (its
    /// `--json FILE` is appended), with the machine's busy cores measured while it runs.
    fn measure(&self, name: &str, words: Words) -> Result<(Value, String, f64), String> {
        let json = self.work.join(format!("{name}.json"));
        let words = words.arg("--json").arg(&json);
        let busy = BusyCores::start();
        process::run(&words, &self.log(name))?;
        let cores = busy.cores();
        let text = std::fs::read_to_string(&json).map_err(|error| format!("{}: {error}", json.display()))?;
        let value = process::parse_json(&text).map_err(|error| format!("{}: {error}", json.display()))?;
        Ok((value, words.text(), cores))
    }

    /// `stripelog create --force` on `members` (RAID-5, 1 MiB chunks): the volume's info.
    fn create(&mut self, name: &str, spare: &str, extra: &[&str]) -> Result<Value, String> {
        self.filled = None;
        let words = self
            .stripelog()
            .args(["create", "--force", "--raid", "5", "--chunk", "1MiB", "--spare", spare, "--json"])
            .args(extra)
            .args(&self.members);
        self.run_json(name, &words)
    }

    /// `stripelog info --json` of the volume on the members.
    fn info(&self, name: &str) -> Result<Value, String> {
        self.run_json(name, &self.stripelog().args(["info", "--json"]).args(&self.members))
    }

    /// Write `bytes` sequentially from `offset` with 1 MiB requests, in process.
    fn write_sequentially(
        &self,
        name: &str,
        offset: u64,
        bytes: u64,
        extra: &[&str],
    ) -> Result<(Value, String, f64), String> {
        let words = self
            .stripelog()
            .args(["bench", "mix"])
            .arg(format!("engine:{}", self.member_list(",")))
            .args(["--force", "-q", "--pattern", "sequential", "--block-size", "1MiB"])
            .arg("--offset")
            .arg(offset.to_string())
            .arg("--region")
            .arg(bytes.to_string())
            .arg("--write-limit")
            .arg(bytes.to_string())
            .args(["--duration", "3600s"])
            .args(extra);
        // The queue depth, unless the caller names one.
        let words = if extra.contains(&"--queue-depth") { words } else { words.args(["--queue-depth", "4"]) };
        self.measure(name, words)
    }

    /// A RAID-5 volume at 27 % spare with 70 % of its logical space written.
    fn filled_volume(&mut self) -> Result<Filled, String> {
        if let Some(filled) = &self.filled {
            return Ok(filled.clone());
        }
        let info = self.create("fill-create", "27%", &[])?;
        let logical = number(&info, "/logical_size_bytes")?;
        let bytes = ((logical * FILL_SHARE) as u64) >> 20 << 20;
        (self.progress)(&format!("  filling {} MiB of the volume", bytes >> 20));
        self.write_sequentially("fill", 0, bytes, &[])?;
        let filled = Filled { bytes };
        self.filled = Some(filled.clone());
        Ok(filled)
    }

    /// fio's io_uring as the engine submits: on the testbed every request goes straight to
    /// the kernel's workers, as the engine's do to a member under a throttle rule (an
    /// inline attempt the throttle holds back is charged twice; stripelog_blockdev's
    /// `throttle` module).
    fn io_uring_fio(&self) -> Vec<String> {
        let mut arguments = vec!["--ioengine=io_uring".to_string()];
        if matches!(self.options.members, super::Members::Testbed(_)) {
            arguments.push("--force_async=1".into());
        }
        arguments
    }

    fn common_fio(&self, runtime: bool) -> Vec<String> {
        let mut arguments: Vec<String> = ["--direct=1", "--group_reporting"].map(String::from).to_vec();
        arguments.extend(self.io_uring_fio());
        if runtime {
            arguments.push("--time_based".into());
            arguments.push(format!("--runtime={}", self.seconds()));
        }
        arguments
    }

    /// fio on the raw members, all at once: sequential write (which also fills member files
    /// with real data) and read per member through libaio, the drives' own speeds (the
    /// bounds); the same through io_uring as the engine submits; 4 KiB random read and
    /// write at depth 32 over all.
    pub fn calibrate(&mut self) -> Result<ArraySpeed, String> {
        let mut array = ArraySpeed::default();
        let per_member = |engine: Vec<String>, rw: &str, runtime: bool| -> Vec<String> {
            let mut arguments: Vec<String> = ["--direct=1", "--bs=1M", "--iodepth=4"].map(String::from).to_vec();
            arguments.extend(engine);
            arguments.push(format!("--rw={rw}"));
            if runtime {
                arguments.push("--time_based".into());
                arguments.push(format!("--runtime={}", self.seconds()));
            }
            for (index, member) in self.members.iter().enumerate() {
                arguments.push(format!("--name=member-{index}"));
                arguments.push(format!("--filename={}", member.display()));
            }
            arguments
        };
        (self.progress)("  sequential writes over each whole member");
        let (write, write_command) =
            self.fio("calibrate-write", per_member(vec!["--ioengine=libaio".into()], "write", false))?;
        let (read, read_command) =
            self.fio("calibrate-read", per_member(vec!["--ioengine=libaio".into()], "read", true))?;
        let (uring_write, uring_write_command) =
            self.fio("calibrate-write-io_uring", per_member(self.io_uring_fio(), "write", true))?;
        let (uring_read, uring_read_command) =
            self.fio("calibrate-read-io_uring", per_member(self.io_uring_fio(), "read", true))?;
        for (index, member) in self.members.iter().enumerate() {
            let size_bytes = std::fs::File::open(member)
                .and_then(|mut file| std::io::Seek::seek(&mut file, std::io::SeekFrom::End(0)))
                .unwrap_or(0);
            array.members.push(MemberSpeed {
                path: member.display().to_string(),
                description: describe_member(member),
                size_bytes,
                sequential_write_bytes_per_second: number(&write, &format!("/jobs/{index}/write/bw_bytes"))?,
                sequential_read_bytes_per_second: number(&read, &format!("/jobs/{index}/read/bw_bytes"))?,
                sequential_write_io_uring_bytes_per_second: number(
                    &uring_write,
                    &format!("/jobs/{index}/write/bw_bytes"),
                )?,
                sequential_read_io_uring_bytes_per_second: number(
                    &uring_read,
                    &format!("/jobs/{index}/read/bw_bytes"),
                )?,
            });
        }
        array.sequential_write_bytes_per_second =
            array.members.iter().map(|member| member.sequential_write_bytes_per_second).sum();
        array.sequential_read_bytes_per_second =
            array.members.iter().map(|member| member.sequential_read_bytes_per_second).sum();
        let random = |rw: &str| -> Vec<String> {
            let mut arguments = self.common_fio(true);
            arguments.extend([
                "--name=random".to_string(),
                format!("--filename={}", self.member_list(":")),
                format!("--rw={rw}"),
                "--bs=4k".into(),
                "--iodepth=32".into(),
                "--file_service_type=random".into(),
            ]);
            arguments
        };
        let (random_read, random_read_command) = self.fio("calibrate-random-read", random("randread"))?;
        let (random_write, random_write_command) = self.fio("calibrate-random-write", random("randwrite"))?;
        array.random_read_iops_depth_32 = number(&random_read, "/jobs/0/read/iops")?;
        array.random_write_iops_depth_32 = number(&random_write, "/jobs/0/write/iops")?;
        array.commands = vec![
            write_command,
            read_command,
            random_read_command,
            random_write_command,
            uring_write_command,
            uring_read_command,
        ];
        self.array = array.clone();
        Ok(array)
    }

    pub fn run_part(&mut self, part: Part) -> PartReport {
        self.notes.clear();
        self.charts.clear();
        let started = Instant::now();
        let busy = BusyCores::start();
        let result = match part {
            Part::Fresh => self.fresh(),
            Part::Steady => self.steady(),
            Part::Reads => self.reads(),
            Part::Nbd => self.nbd(1),
            Part::NbdMulti => self.nbd(4),
            Part::Sync => self.sync(),
            Part::Rebuild => self.rebuild(),
            Part::Check => self.check(),
            Part::Compression => self.compression(),
            Part::Dedup => self.dedup(),
            Part::Cores => self.cores(),
            Part::Index => self.index(),
        };
        let cores_busy = busy.cores();
        let (figures, error) = match result {
            Ok(figures) => (figures, None),
            Err(error) => (Vec::new(), Some(error)),
        };
        PartReport {
            part,
            title: part.title().to_string(),
            seconds: started.elapsed().as_secs_f64(),
            cores_busy,
            limit: limit_of(part, &figures),
            figures,
            charts: self.charts.clone(),
            notes: self.notes.clone(),
            error,
        }
    }

    /// The members' sequential write bandwidth in 4 KiB host blocks per second, after parity.
    fn sequential_blocks_per_second(&self) -> f64 {
        self.array.sequential_write_bytes_per_second * self.data_share() / BLOCK_BYTES
    }

    fn fio_sequential_command(&self) -> String {
        self.array.commands.first().cloned().unwrap_or_default()
    }

    fn fresh(&mut self) -> Result<Vec<Figure>, String> {
        self.filled = None;
        let words = self
            .stripelog()
            .args(["bench", "engine", "--devices", &self.member_list(","), "--region", "1TiB"])
            .arg("--duration")
            .arg(format!("{}s", self.seconds()))
            .args(["--threads", "1,2", "--read-threads", "1", "--force"]);
        let (report, command, cores) = self.measure("fresh", words)?;
        let bound = self.sequential_blocks_per_second();
        let mut figures = Vec::new();
        for (index, threads) in [1, 2].into_iter().enumerate() {
            let iops = number(&report, &format!("/random_write/{index}/iops"))?;
            if report.pointer(&format!("/random_write/{index}/stopped_by_space_budget")) == Some(&Value::Bool(true)) {
                self.notes.push(format!(
                    "the {threads}-thread phase stopped at its space budget before {} s: a fresh volume stays fresh",
                    self.seconds()
                ));
            }
            figures.push(
                Figure::new(format!("4 KiB random writes, {threads} thread(s), IOPS"), iops, "IOPS", &command)
                    .beside(
                        "fio sequential 1 MiB writes on the raw members × data share, in 4 KiB blocks/s",
                        bound,
                        &self.fio_sequential_command(),
                    )
                    .busy(cores),
            );
        }
        Ok(figures)
    }

    /// `bench saturate` on the members: a fresh volume at 27 % spare written by 4 threads
    /// until the steady state or the time limit.
    fn saturate(&self) -> Words {
        self.stripelog()
            .args(["bench", "saturate", "--devices", &self.member_list(","), "--spare", "27%", "--passes", "20"])
            .arg("--time-limit")
            .arg(format!("{}s", self.options.steady_limit.as_secs()))
            .args(["--threads", "4", "--force", "--quiet"])
    }

    /// `bench mix` on the volume on the members: 4 KiB random reads at depth 32 over
    /// `region` bytes, block cache off, for a cell.
    fn cache_off_reads(&self, region: u64) -> Words {
        self.stripelog()
            .args(["bench", "mix"])
            .arg(format!("engine:{}", self.member_list(",")))
            .args(["--engine-cache", "0", "-q", "--read-percent", "100", "--queue-depth", "32"])
            .arg("--duration")
            .arg(format!("{}s", self.seconds()))
            .arg("--region")
            .arg(region.to_string())
    }

    fn steady(&mut self) -> Result<Vec<Figure>, String> {
        self.filled = None;
        let chart = self.options.output.join("steady.svg");
        let mut words = self.saturate().arg("--chart").arg(&chart);
        if let Some(bytes) = self.options.steady_write_queue_bytes {
            words = words.arg("--write-queue").arg(format!("{bytes}"));
        }
        let (report, command, cores) = self.measure("steady", words)?;
        self.charts.push("steady.svg".into());
        let iops = number(&report, "/cleaner_bound_iops")? * number(&report, "/ratio_to_cleaner_bound")?;
        let amplification = number(&report, "/write_amplification")?;
        let data_fraction = number(&report, "/data_fraction")?;
        let read_per_relocated = number(&report, "/cleaner_read_per_relocated_byte")?.max(1.0);
        // What one host block costs the members in steady state: its data and parity and
        // the cleaner's copies of live blocks, and the cleaner's reads of them.
        let write_per_block = amplification * BLOCK_BYTES / data_fraction;
        let read_per_block = (amplification - 1.0).max(0.0) * read_per_relocated * BLOCK_BYTES;
        let read_percent = (100.0 * read_per_block / (read_per_block + write_per_block)).round() as u32;
        let mut arguments = self.common_fio(true);
        arguments.extend([
            "--name=cleaner-mix".to_string(),
            format!("--filename={}", self.member_list(":")),
            "--rw=randrw".into(),
            format!("--rwmixread={read_percent}"),
            "--bs=1M".into(),
            format!("--iodepth={}", 4 * self.members.len()),
            "--file_service_type=random".into(),
        ]);
        let (mix, mix_command) = self.fio("steady-cleaner-mix", arguments)?;
        let moved = number(&mix, "/jobs/0/read/bw_bytes")? + number(&mix, "/jobs/0/write/bw_bytes")?;
        let bound = moved / (read_per_block + write_per_block);
        // The drives' own worst write: a client write that finds every write buffer in
        // flight waits for a batch of 1 MiB chunk writes to reach the members.
        let mix_write_maximum_milliseconds = number(&mix, "/jobs/0/write/clat_ns/max")? / 1e6;
        let mut arguments = self.common_fio(true);
        arguments.extend([
            "--name=alone-depth-1".to_string(),
            format!("--filename={}", self.members[0].display()),
            "--rw=randwrite".into(),
            "--bs=1M".into(),
            "--iodepth=1".into(),
        ]);
        let (alone, alone_command) = self.fio("steady-write-latency", arguments)?;
        let alone_write_maximum_milliseconds = number(&alone, "/jobs/0/write/clat_ns/max")? / 1e6;
        self.notes.push(format!(
            "the members' own 1 MiB writes took up to {mix_write_maximum_milliseconds:.1} ms in that mix, and up to \
             {alone_write_maximum_milliseconds:.1} ms one at a time on one idle member ({alone_command})"
        ));
        self.notes.push(format!(
            "steady state: write amplification {amplification:.2}; each host block costs the members {:.1} KiB \
             written and {:.1} KiB read; fio ran that mix ({read_percent} % reads, 1 MiB) at {:.0} MB/s",
            write_per_block / 1024.0,
            read_per_block / 1024.0,
            moved / 1e6
        ));
        // What a write that waited was waiting for (the latency figure's causes).
        self.notes.push(format!(
            "writes that waited: {:.0} for a write buffer ({:.1} s in all), {:.0} for a free segment ({:.1} s); \
             batches: {:.0} whole stripes and {:.0} short ones (sealed early by a flush or the cleaner's batches), \
             at most {:.0} in flight",
            number(&report, "/writes_stalled_for_buffers")?,
            number(&report, "/buffer_stall_seconds")?,
            number(&report, "/writes_stalled_for_space")?,
            number(&report, "/space_stall_seconds")?,
            number(&report, "/full_stripes")?,
            number(&report, "/short_stripes")?,
            number(&report, "/write_queue_batches")?,
        ));
        let first = report.pointer("/steady_state/first_interval").and_then(Value::as_u64);
        if first.is_none() {
            self.notes.push(
                "NO STEADY STATE by the SNIA rule within the time limit: the IOPS is the mean of the last intervals"
                    .into(),
            );
        }
        let intervals = report.pointer("/intervals").and_then(Value::as_array).cloned().unwrap_or_default();
        let worst_latency_milliseconds = intervals
            .iter()
            .skip(first.unwrap_or(0) as usize)
            .filter_map(|interval| interval.get("latency_max_ns").and_then(Value::as_f64))
            .fold(0.0f64, f64::max)
            / 1e6;
        // The bound from the members' own speeds (fio's, at the start of the run): on the
        // testbed each drive has a read budget and a write budget of its own; files of one
        // disk, or drives, spend one time on both.
        let testbed = matches!(self.options.members, super::Members::Testbed(_));
        let bound_of = |write_speed: f64, read_speed: f64| {
            if testbed {
                (write_speed / write_per_block).min(read_speed / read_per_block.max(1e-9))
            } else {
                1.0 / (write_per_block / write_speed + read_per_block / read_speed)
            }
        };
        let computed =
            bound_of(self.array.sequential_write_bytes_per_second, self.array.sequential_read_bytes_per_second);
        let uring_write: f64 =
            self.array.members.iter().map(|member| member.sequential_write_io_uring_bytes_per_second).sum();
        let uring_read: f64 =
            self.array.members.iter().map(|member| member.sequential_read_io_uring_bytes_per_second).sum();
        let uring_bound = bound_of(uring_write, uring_read);
        let formula = if matches!(self.options.members, super::Members::Testbed(_)) {
            "min(W ÷ written per block, R ÷ read per block)"
        } else {
            "1 ÷ (written per block ÷ W + read per block ÷ R)"
        };
        Ok(vec![
            Figure::new("4 KiB random writes, 4 threads, steady state, IOPS", iops, "IOPS", &command)
                .beside(
                    format!("the cleaner's traffic bound from the members' fio speeds W and R: {formula}"),
                    computed,
                    &self.fio_sequential_command(),
                )
                .at_least(STEADY_BAR, Some(STEADY_GOAL))
                .busy(cores),
            Figure::new("the same steady-state IOPS", iops, "IOPS", &command).beside(
                "fio running the cleaner's read/write mix on the raw members (io_uring), host blocks/s",
                bound,
                &mix_command,
            ),
            Figure::new("the same steady-state IOPS", iops, "IOPS", &command).beside(
                "the same bound from the members' speeds through io_uring, the engine's path",
                uring_bound,
                self.array.commands.get(4).map_or("", String::as_str),
            ),
            Figure::new(
                "largest write latency of a 10 s interval from the steady state on",
                worst_latency_milliseconds,
                "ms",
                &command,
            )
            .beside(
                "fio's largest 1 MiB write completion on the raw members in the cleaner's read/write mix, ms",
                mix_write_maximum_milliseconds,
                &mix_command,
            )
            .at_most(STEADY_LATENCY_BAR_MILLISECONDS),
            Figure::new("write amplification (member bytes written ÷ host bytes)", amplification, "", &command),
        ])
    }

    fn reads(&mut self) -> Result<Vec<Figure>, String> {
        let filled = self.filled_volume()?;
        let chart = self.options.output.join("reads-latency.svg");
        let words = self.cache_off_reads(filled.bytes).arg("--chart").arg(&chart);
        let (engine, engine_command, cores) = self.measure("reads-engine", words)?;
        self.charts.push("reads-latency.svg".into());
        // The raw members over the same footprint: the volume's bytes and their parity.
        let footprint = ((filled.bytes as f64 / self.data_share()) as u64) >> 20;
        let mut arguments = self.common_fio(true);
        arguments.extend([
            "--name=raw-read".to_string(),
            format!("--filename={}", self.member_list(":")),
            "--rw=randread".into(),
            "--bs=4k".into(),
            "--iodepth=32".into(),
            format!("--size={footprint}m"),
            "--file_service_type=random".into(),
        ]);
        let (raw, raw_command) = self.fio("reads-raw", arguments)?;
        let raw_iops = number(&raw, "/jobs/0/read/iops")?;
        let server = self.serve("reads-serve", &["--cache", "0"])?;
        let words = self
            .stripelog()
            .args(["bench", "mix", &server.uri("stripelog"), "-q", "--read-percent", "100", "--queue-depth", "32"])
            .arg("--duration")
            .arg(format!("{}s", self.seconds()))
            .arg("--region")
            .arg(filled.bytes.to_string());
        let (nbd, nbd_command, nbd_cores) = self.measure("reads-nbd", words)?;
        server.stop()?;
        Ok(vec![
            Figure::new(
                "4 KiB random reads, depth 32, in process, IOPS",
                number(&engine, "/read/iops")?,
                "IOPS",
                &engine_command,
            )
            .beside("fio 4 KiB random reads at depth 32 on the raw members", raw_iops, &raw_command)
            .at_least(0.9, None)
            .busy(cores),
            Figure::new(
                "4 KiB random reads, depth 32, over NBD, IOPS",
                number(&nbd, "/read/iops")?,
                "IOPS",
                &nbd_command,
            )
            .beside("fio 4 KiB random reads at depth 32 on the raw members", raw_iops, &raw_command)
            .busy(nbd_cores),
        ])
    }

    /// The index beyond its cache (docs/index-and-checkpoints.md, "Paging"): steady-state
    /// 4 KiB random writes in process, one volume per map cache; then, on one volume 70 %
    /// written, cache-off random reads at depth 32 in process; then, per map cache on a
    /// volume filled anew, uniform and Zipf(0.99) random writes over the whole logical
    /// space through NBD, and the mount's time after a clean close and after a SIGKILL.
    /// Each cache's figure beside the whole index's.
    fn index(&mut self) -> Result<Vec<Figure>, String> {
        let mut figures = Vec::new();
        let mut whole_index_bytes = 0u64;
        let mut resident: Option<(f64, String)> = None;
        let cache_of = |share: f64, whole: u64| ((whole as f64 * share) as u64).max(4096);
        for (label, share) in INDEX_CACHE_SHARES {
            let mut words = self.saturate().arg("--interval").arg(format!("{}s", self.seconds()));
            if share < 1.0 {
                words = words.arg("--map-cache").arg(cache_of(share, whole_index_bytes).to_string());
            }
            let (report, command, cores) = self.measure(&format!("index-steady-{}", share_name(share)), words)?;
            let iops = number(&report, "/cleaner_bound_iops")? * number(&report, "/ratio_to_cleaner_bound")?;
            if share == 1.0 {
                whole_index_bytes = number(&report, "/map_cache/whole_index_bytes")? as u64;
            }
            self.notes.push(format!("steady state, {label}: {}", paging_counts(&report)?));
            let name = format!("4 KiB random writes in process, steady state, map cache {label}, IOPS");
            let figure = match &resident {
                None => Figure::new(name, iops, "IOPS", &command).beside(
                    "the cleaner's traffic bound from the members' fio speeds",
                    number(&report, "/cleaner_bound_iops")?,
                    &self.fio_sequential_command(),
                ),
                Some((resident_iops, resident_command)) => Figure::new(name, iops, "IOPS", &command).beside(
                    "the same with the whole index in the cache",
                    *resident_iops,
                    resident_command,
                ),
            };
            let figure = match share_name(share) {
                "quarter" => figure.at_least(INDEX_QUARTER_BAR.0, Some(INDEX_QUARTER_BAR.1)),
                "tenth" => figure.at_least(INDEX_TENTH_BAR.0, Some(INDEX_TENTH_BAR.1)),
                _ => figure,
            };
            figures.push(figure.busy(cores));
            if share == 1.0 {
                resident = Some((iops, command));
            }
        }
        // One volume, 70 % written, for the reads (which leave it as it is: the first
        // cache's NBD runs below take it over).
        let filled = self.filled_volume()?;
        let logical = number(&self.info("index-info")?, "/logical_size_bytes")? as u64;
        let mut reads: Option<(f64, String)> = None;
        for (label, share) in INDEX_CACHE_SHARES.into_iter().filter(|(_, share)| *share != 0.5) {
            let mut words = self.cache_off_reads(filled.bytes);
            if share < 1.0 {
                words = words.arg("--map-cache").arg(cache_of(share, whole_index_bytes).to_string());
            }
            let (report, command, cores) = self.measure(&format!("index-reads-{}", share_name(share)), words)?;
            let iops = number(&report, "/read/iops")?;
            let name = format!("4 KiB random reads, depth 32, block cache off, map cache {label}, IOPS");
            match &reads {
                None => reads = Some((iops, command)),
                Some((whole_iops, whole_command)) => {
                    let figure = Figure::new(name, iops, "IOPS", &command)
                        .beside("the same with the whole index in the cache", *whole_iops, whole_command)
                        .busy(cores);
                    figures.push(if share == 0.25 { figure.at_least(INDEX_READS_QUARTER_BAR, None) } else { figure });
                }
            }
        }
        // Through NBD, over the whole logical space: uniform, then Zipf(0.99) (fio refuses
        // a theta of exactly 1). Each cache on a volume just filled, so that each starts
        // from the same history (the writes of the runs before would leave a later one
        // more to clean).
        let whole_space = format!("--size={logical}");
        let mut through_nbd: Vec<(&str, f64, String)> = Vec::new();
        for (label, share) in INDEX_CACHE_SHARES.into_iter().filter(|(_, share)| *share != 0.5) {
            self.filled_volume()?;
            let mut extra = vec!["--cache".to_string(), "0".to_string()];
            if share < 1.0 {
                extra.extend(["--map-cache".to_string(), cache_of(share, whole_index_bytes).to_string()]);
            }
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            let server = self.serve(&format!("index-serve-{}", share_name(share)), &extra)?;
            let uri = server.uri("stripelog");
            for (distribution, what) in [("random", "uniform"), ("zipf:0.99", "Zipf(0.99)")] {
                let arguments =
                    [whole_space.as_str(), "--norandommap", &format!("--random_distribution={distribution}")];
                let (result, command) = self.fio_nbd(
                    &format!("index-nbd-{}-{}", share_name(share), what.replace(['(', ')', '.'], "")),
                    &uri,
                    "randwrite",
                    32,
                    1,
                    &arguments,
                )?;
                let iops = fio_iops(&result)?;
                let name = format!("4 KiB random writes, {what}, over NBD, map cache {label}, IOPS");
                match through_nbd.iter().find(|(whole_what, _, _)| *whole_what == what) {
                    None => through_nbd.push((what, iops, command)),
                    Some((_, whole_iops, whole_command)) => {
                        let figure = Figure::new(name, iops, "IOPS", &command).beside(
                            "the same with the whole index in the cache",
                            *whole_iops,
                            whole_command,
                        );
                        figures.push(match (what, share_name(share)) {
                            ("Zipf(0.99)", "tenth") => figure.at_least(INDEX_ZIPF_TENTH_BAR, None),
                            ("uniform", "quarter") => figure.at_least(INDEX_QUARTER_BAR.0, Some(INDEX_QUARTER_BAR.1)),
                            ("uniform", "tenth") => figure.at_least(INDEX_TENTH_BAR.0, Some(INDEX_TENTH_BAR.1)),
                            _ => figure,
                        });
                    }
                }
            }
            // The mount's time after a clean close, then after a SIGKILL under writes.
            server.stop()?;
            let (clean, clean_command) = self.timed_info(&format!("index-mount-clean-{}", share_name(share)))?;
            let server = self.serve(&format!("index-serve-kill-{}", share_name(share)), &extra)?;
            let arguments = [whole_space.as_str(), "--norandommap", "--runtime=5"];
            self.fio_nbd(
                &format!("index-nbd-{}-before-kill", share_name(share)),
                &server.uri("stripelog"),
                "randwrite",
                32,
                1,
                &arguments,
            )?;
            server.kill()?;
            // (Written since it was filled: the next cache fills a new one.)
            self.filled = None;
            let (killed, killed_command) = self.timed_info(&format!("index-mount-killed-{}", share_name(share)))?;
            let tebibytes = logical as f64 / (1u64 << 40) as f64;
            self.notes.push(format!(
                "map cache {label}: a read-only mount (`{clean_command}`) took {clean:.2} s after a clean close \
                 ({:.2} s per TiB of the {:.3} TiB volume) and {killed:.2} s after a SIGKILL under 5 s of random \
                 writes (`{killed_command}`)",
                clean / tebibytes,
                tebibytes
            ));
        }
        Ok(figures)
    }

    /// `stripelog info --json` of the volume on the members, timed: a mount (read-only).
    fn timed_info(&self, name: &str) -> Result<(f64, String), String> {
        let words = self.stripelog().args(["info", "--json"]).args(&self.members);
        let started = Instant::now();
        process::run(&words, &self.log(name))?;
        Ok((started.elapsed().as_secs_f64(), words.text()))
    }

    /// `stripelog serve` on the members, on a Unix socket in work/.
    fn serve(&self, name: &str, extra: &[&str]) -> Result<Server, String> {
        self.serve_with(name, &[], extra)
    }

    fn serve_with(&self, name: &str, prefix: &[&str], extra: &[&str]) -> Result<Server, String> {
        let socket = self.work.join(format!("{name}.sock"));
        let words = if prefix.is_empty() {
            self.stripelog()
        } else {
            Words::new(prefix[0]).args(&prefix[1..]).arg(&self.options.stripelog)
        };
        let words = words.arg("serve").arg("--socket").arg(&socket).args(extra).args(&self.members);
        Server::start("stripelog serve", &words, &socket, &self.log(name))
    }

    fn nbdkit(&self, name: &str, plugin: &[String]) -> Result<Server, String> {
        let socket = self.work.join(format!("{name}.sock"));
        let words = Words::new("nbdkit").args(["--foreground", "--unix"]).arg(&socket).args(plugin);
        Server::start("nbdkit", &words, &socket, &self.log(name))
    }

    /// fio's nbd engine on `uri`: `rw` with 4 KiB requests.
    fn fio_nbd(
        &self,
        name: &str,
        uri: &str,
        rw: &str,
        depth: u32,
        jobs: usize,
        extra: &[&str],
    ) -> Result<(Value, String), String> {
        let mut arguments: Vec<String> = vec![
            format!("--name={name}"),
            "--ioengine=nbd".into(),
            format!("--uri={uri}"),
            format!("--rw={rw}"),
            "--bs=4k".into(),
            format!("--iodepth={depth}"),
            format!("--numjobs={jobs}"),
            "--group_reporting".into(),
            "--size=1g".into(),
            "--time_based".into(),
            format!("--runtime={}", self.seconds()),
        ];
        arguments.extend(extra.iter().map(|word| word.to_string()));
        self.fio(name, arguments)
    }

    fn fio_nbd_fill(&self, name: &str, uri: &str) -> Result<(), String> {
        let arguments: Vec<String> = vec![
            format!("--name={name}"),
            "--ioengine=nbd".into(),
            format!("--uri={uri}"),
            "--rw=write".into(),
            "--bs=1m".into(),
            "--iodepth=8".into(),
            "--size=1g".into(),
        ];
        self.fio(name, arguments).map(|_| ())
    }

    fn nbd(&mut self, connections: usize) -> Result<Vec<Figure>, String> {
        let name = if connections == 1 { "nbd" } else { "nbd-multi" };
        self.create(&format!("{name}-create"), "20%", &[])?;
        let server = self.serve(&format!("{name}-serve"), &["--cache", "1GiB"])?;
        let peer = self.nbdkit(&format!("{name}-nbdkit"), &["memory".into(), "4G".into()])?;
        let (stripelog_uri, peer_uri) = (server.uri("stripelog"), peer.uri(""));
        self.fio_nbd_fill(&format!("{name}-fill-stripelog"), &stripelog_uri)?;
        self.fio_nbd_fill(&format!("{name}-fill-nbdkit"), &peer_uri)?;
        let mut figures = Vec::new();
        for (rw, what) in [("randwrite", "writes"), ("randread", "reads")] {
            let busy = BusyCores::start();
            let (ours, our_command) =
                self.fio_nbd(&format!("{name}-{rw}-stripelog"), &stripelog_uri, rw, 32, connections, &[])?;
            let cores = busy.cores();
            let (theirs, their_command) =
                self.fio_nbd(&format!("{name}-{rw}-nbdkit"), &peer_uri, rw, 32, connections, &[])?;
            let figure = Figure::new(
                format!("4 KiB random {what}, {connections} connection(s) × depth 32, IOPS"),
                fio_iops(&ours)?,
                "IOPS",
                &our_command,
            )
            .beside("nbdkit memory, the same fio", fio_iops(&theirs)?, &their_command)
            .busy(cores);
            figures.push(if connections == 1 && rw == "randwrite" { figure.at_least(1.0, Some(1.2)) } else { figure });
        }
        server.stop()?;
        peer.stop()?;
        Ok(figures)
    }

    /// Where `nbdkit file` keeps the peer's data: beside the member files, or on the spare
    /// drive of a testbed or of named devices.
    fn peer_file(&self) -> Option<PathBuf> {
        match &self.options.members {
            super::Members::Files { directory, .. } => Some(directory.join("peer-file")),
            _ => self.spare.clone(),
        }
    }

    fn sync(&mut self) -> Result<Vec<Figure>, String> {
        let peer_path = self
            .peer_file()
            .ok_or("the sync part's peer (nbdkit file) needs a spare device beside the members: --spare-device")?;
        if !peer_path.exists() {
            let file =
                std::fs::File::create(&peer_path).map_err(|error| format!("{}: {error}", peer_path.display()))?;
            file.set_len(2 << 30).map_err(|error| format!("{}: {error}", peer_path.display()))?;
        }
        let peer = self.nbdkit("sync-nbdkit", &["file".into(), format!("file={}", peer_path.display())])?;
        let (peer_result, peer_command) =
            self.fio_nbd("sync-nbdkit", &peer.uri(""), "randwrite", 1, 1, &["--fsync=1"])?;
        peer.stop()?;
        let peer_iops = fio_iops(&peer_result)?;
        // The write log's file, standing in for NVDIMM or a drive with power-loss
        // protection; removed whatever happens to the part.
        let log_path = Path::new("/dev/shm").join(format!("stripelog-suite-log-{}", std::process::id()));
        let result = self.sync_against(&peer_path, &log_path, &peer_result, peer_iops, &peer_command);
        let _ = std::fs::remove_file(&log_path);
        self.filled = None;
        result
    }

    /// The sync part's stripelog figures, without and with a write log at `log_path`.
    fn sync_against(
        &mut self,
        peer_path: &Path,
        log_path: &Path,
        peer_result: &Value,
        peer_iops: f64,
        peer_command: &str,
    ) -> Result<Vec<Figure>, String> {
        let mut figures = Vec::new();
        for (label, extra) in [
            ("no write log", vec![]),
            (
                "write log on /dev/shm",
                vec!["--log".to_string(), log_path.display().to_string(), "--log-size".into(), "256MiB".into()],
            ),
        ] {
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            self.create("sync-create", "20%", &extra)?;
            let server = self.serve("sync-serve", &[])?;
            let busy = BusyCores::start();
            let (ours, command) =
                self.fio_nbd("sync-stripelog", &server.uri("stripelog"), "randwrite", 1, 1, &["--fsync=1"])?;
            let cores = busy.cores();
            server.stop()?;
            figures.push(
                Figure::new(format!("durable 4 KiB writes/s ({label})"), fio_iops(&ours)?, "writes/s", &command)
                    .beside(format!("nbdkit file on {}", peer_path.display()), peer_iops, peer_command)
                    .busy(cores),
            );
            let p99 = |value: &Value| {
                number(value, "/jobs/0/sync/lat_ns/percentile/99.000000")
                    .or_else(|_| number(value, "/jobs/0/write/clat_ns/percentile/99.000000"))
            };
            figures.push(
                Figure::new(
                    format!("p99 latency of a write and its flush ({label})"),
                    p99(&ours)? / 1e3,
                    "µs",
                    &command,
                )
                .beside("nbdkit file", p99(peer_result)? / 1e3, peer_command),
            );
        }
        Ok(figures)
    }

    fn rebuild(&mut self) -> Result<Vec<Figure>, String> {
        let spare = self
            .spare
            .clone()
            .ok_or("the rebuild part needs a spare beside the members to rebuild onto: --spare-device")?;
        self.filled_volume()?;
        // The whole new member written once, as the calibration writes the members (a
        // time-based run would rewrite a small file's first bytes in a cache).
        let mut arguments: Vec<String> = ["--direct=1", "--ioengine=libaio"].map(String::from).to_vec();
        arguments.extend([
            "--name=spare-write".to_string(),
            format!("--filename={}", spare.display()),
            "--rw=write".into(),
            "--bs=1M".into(),
            "--iodepth=4".into(),
        ]);
        let (write, write_command) = self.fio("rebuild-spare-write", arguments)?;
        let member_write = number(&write, "/jobs/0/write/bw_bytes")?;
        const REBUILT: usize = 2;
        let old = self.members[REBUILT].clone();
        let mut member_words: Vec<String> = self.members.iter().map(|path| path.display().to_string()).collect();
        member_words[REBUILT] = "missing".into();
        let words = self
            .stripelog()
            .args(["replace", "--member", &REBUILT.to_string(), "--with"])
            .arg(&spare)
            .args(["--force", "--json"])
            .args(&member_words);
        // Until the rebuild has succeeded, the volume on the members is degraded.
        let filled = self.filled.take();
        let busy = BusyCores::start();
        let report = self.run_json("rebuild", &words)?;
        let cores = busy.cores();
        self.filled = filled;
        // The spare is a member now; the member it replaced is the spare.
        self.members[REBUILT] = spare;
        self.spare = Some(old);
        let speed = number(&report, "/bytes_written")? / number(&report, "/seconds")?.max(1e-9);
        if let super::Members::Files { .. } = self.options.members {
            self.notes.push(format!(
                "the member files share one disk: the rebuild reads {} members from it for each one it writes \
                 there, so this ratio says what the disk allows, not what separate drives would (the testbed's part \
                 judges the bar)",
                self.members.len() - 1
            ));
        }
        Ok(vec![Figure::new("rebuild, bytes written to the new member per second", speed / 1e6, "MB/s", &words.text())
            .beside("fio sequential 1 MiB writes on the new member alone", member_write / 1e6, &write_command)
            .at_least(0.5, Some(0.8))
            .busy(cores)])
    }

    fn check(&mut self) -> Result<Vec<Figure>, String> {
        self.filled_volume()?;
        let words = self.stripelog().args(["check", "--json"]).args(&self.members);
        let busy = BusyCores::start();
        let report = self.run_json("check", &words)?;
        let cores = busy.cores();
        let speed = number(&report, "/bytes_read")? / number(&report, "/seconds")?.max(1e-9);
        Ok(vec![Figure::new("check, member bytes read per second", speed / 1e6, "MB/s", &words.text())
            .beside(
                "fio sequential 1 MiB reads on all raw members at once",
                self.array.sequential_read_bytes_per_second / 1e6,
                self.array.commands.get(1).map_or("", String::as_str),
            )
            .busy(cores)])
    }

    /// Bytes the compression and dedup parts write: enough to measure, bounded in time.
    fn data_part_bytes(&self, logical: f64, share: f64) -> u64 {
        ((logical * share).min((4u64 << 30) as f64) as u64) >> 20 << 20
    }

    fn compression(&mut self) -> Result<Vec<Figure>, String> {
        let mut results = Vec::new();
        for setting in ["off", "lz4"] {
            let info = self.create(&format!("compression-{setting}-create"), "27%", &["--compression", setting])?;
            let bytes = self.data_part_bytes(number(&info, "/logical_size_bytes")?, 0.5);
            let (written, command, cores) =
                self.write_sequentially(&format!("compression-{setting}"), 0, bytes, &["--compressible", "50"])?;
            let info = self.info(&format!("compression-{setting}-info"))?;
            let ratio = if setting == "off" { 1.0 } else { number(&info, "/compression/ratio")? };
            results.push((number(&written, "/write/bw_bytes")?, command, ratio, cores));
        }
        self.filled = None;
        let ((off_speed, off_command, _, _), (lz4_speed, lz4_command, ratio, cores)) =
            (results[0].clone(), results[1].clone());
        Ok(vec![
            Figure::new(
                "sequential 1 MiB writes of half-zero blocks, lz4, MB/s",
                lz4_speed / 1e6,
                "MB/s",
                &lz4_command,
            )
            .beside("the same writes, compression off", off_speed / 1e6, &off_command)
            .busy(cores),
            Figure::new("space: logical data ÷ physical data stored (lz4)", ratio, "×", &lz4_command),
        ])
    }

    fn dedup(&mut self) -> Result<Vec<Figure>, String> {
        let mut results = Vec::new();
        for setting in ["off", "on"] {
            let info = self.create(&format!("dedup-{setting}-create"), "27%", &["--dedup", setting])?;
            let bytes = self.data_part_bytes(number(&info, "/logical_size_bytes")?, 0.3);
            // The same seed writes the same blocks in the same order at depth 1: the second
            // copy duplicates the first.
            let same = ["--seed", "7", "--queue-depth", "1"];
            self.write_sequentially(&format!("dedup-{setting}-first"), 0, bytes, &same)?;
            let (second, command, cores) =
                self.write_sequentially(&format!("dedup-{setting}-second"), bytes, bytes, &same)?;
            let info = self.info(&format!("dedup-{setting}-info"))?;
            let ratio = if setting == "off" { 1.0 } else { number(&info, "/deduplication/ratio")? };
            results.push((number(&second, "/write/bw_bytes")?, command, ratio, cores));
        }
        self.filled = None;
        let ((off_speed, off_command, _, _), (on_speed, on_command, ratio, cores)) =
            (results[0].clone(), results[1].clone());
        Ok(vec![
            Figure::new(
                "second copy, sequential 1 MiB writes at depth 1, dedup on, MB/s",
                on_speed / 1e6,
                "MB/s",
                &on_command,
            )
            .beside("the same writes, dedup off", off_speed / 1e6, &off_command)
            .busy(cores),
            Figure::new("space: logical blocks ÷ blocks stored (two copies)", ratio, "×", &on_command)
                .at_least(1.9, None),
        ])
    }

    /// The cores part runs on members in memory (/dev/shm), so that the drives are not
    /// what limits it: what it measures is what a second core adds to the server.
    fn cores(&mut self) -> Result<Vec<Figure>, String> {
        let memory_members: Vec<PathBuf> = (0..self.members.len())
            .map(|index| Path::new("/dev/shm").join(format!("stripelog-suite-cores-{}-{index}", std::process::id())))
            .collect();
        for path in &memory_members {
            let file = std::fs::File::create(path).map_err(|error| format!("{}: {error}", path.display()))?;
            file.set_len(1 << 30).map_err(|error| format!("{}: {error}", path.display()))?;
        }
        let members = std::mem::replace(&mut self.members, memory_members.clone());
        let result = self.cores_on_members();
        self.members = members;
        self.filled = None;
        for path in &memory_members {
            let _ = std::fs::remove_file(path);
        }
        result
    }

    fn cores_on_members(&mut self) -> Result<Vec<Figure>, String> {
        self.create("cores-create", "20%", &[])?;
        let mut results = Vec::new();
        for cpus in ["0", "0,1"] {
            let server = self.serve_with(&format!("cores-{cpus}"), &["taskset", "-c", cpus], &["--cache", "1GiB"])?;
            let words = self
                .stripelog()
                .args([
                    "bench",
                    "mix",
                    &server.uri("stripelog"),
                    "--force",
                    "-q",
                    "--threads",
                    "2",
                    "--queue-depth",
                    "32",
                    "--region",
                    "1GiB",
                ])
                .arg("--duration")
                .arg(format!("{}s", self.seconds()));
            let (report, command, cores) = self.measure(&format!("cores-{cpus}"), words)?;
            server.stop()?;
            results.push((number(&report, "/write/iops")?, command, cores));
        }
        let ((one, one_command, _), (two, two_command, cores)) = (results[0].clone(), results[1].clone());
        Ok(vec![Figure::new(
            "NBD 4 KiB random writes, 2 connections, server on 2 cores, IOPS",
            two,
            "IOPS",
            &two_command,
        )
        .beside("the same, server on 1 core", one, &one_command)
        .at_least(1.7, None)
        .busy(cores)])
    }
}

impl Figure {
    fn busy(mut self, cores: f64) -> Figure {
        self.cores_busy = Some(cores);
        self
    }
}

/// What limited a part, from its first figure: the cores when the machine was nearly all
/// busy, the drives when the figure reached their own bound, otherwise neither.
fn limit_of(part: Part, figures: &[Figure]) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |count| count.get()) as f64;
    let Some(figure) = figures.first() else { return "not measured".into() };
    let busy = figure.cores_busy.unwrap_or(0.0);
    let drive_peer = matches!(part, Part::Fresh | Part::Steady | Part::Reads | Part::Rebuild | Part::Check);
    if busy >= CORES_LIMIT_SHARE * cores {
        format!("the cores: {busy:.2} of {cores:.0} busy during the measurement")
    } else if drive_peer && figure.ratio.is_some_and(|ratio| ratio >= DRIVES_LIMIT_SHARE) {
        format!(
            "the drives: {:.2} of their own bound measured by fio ({busy:.2} of {cores:.0} cores busy)",
            figure.ratio.unwrap_or(0.0)
        )
    } else {
        format!(
            "neither the cores ({busy:.2} of {cores:.0} busy) nor {}: the request path's latency (queue depth, \
             flushes)",
            if drive_peer { "the drives at their fio bound" } else { "a drive bound (the peer is a server)" }
        )
    }
}

/// The machine's busy cores over an interval, from /proc/stat.
struct BusyCores {
    started: Instant,
    busy_ticks: u64,
}

impl BusyCores {
    fn start() -> BusyCores {
        BusyCores { started: Instant::now(), busy_ticks: busy_ticks() }
    }

    fn cores(&self) -> f64 {
        // SAFETY: sysconf has no memory effects.
        let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let seconds = self.started.elapsed().as_secs_f64().max(1e-3);
        busy_ticks().saturating_sub(self.busy_ticks) as f64 / ticks_per_second / seconds
    }
}

/// Ticks all cores spent neither idle nor waiting for I/O since boot.
fn busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|line| line.starts_with("cpu ")) else { return 0 };
    let fields: Vec<u64> = line.split_whitespace().skip(1).filter_map(|field| field.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest is inside user).
    fields.iter().take(8).enumerate().filter(|(index, _)| *index != 3 && *index != 4).map(|(_, ticks)| ticks).sum()
}

fn describe_member(path: &Path) -> String {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.file_type().is_block_device() => {
            let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
            let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok();
            match backing {
                Some(file) => format!("loop device over {}", file.trim()),
                None => "block device".into(),
            }
        }
        Ok(_) => "file (O_DIRECT)".into(),
        Err(error) => format!("unreadable: {error}"),
    }
}

/// A number in a JSON report, by JSON pointer; an error names what was missing.
fn number(value: &Value, pointer: &str) -> Result<f64, String> {
    value.pointer(pointer).and_then(Value::as_f64).ok_or_else(|| format!("the report has no number at {pointer}"))
}

/// Reads and writes per second of a fio report (its jobs grouped).
/// A map cache share's short name.
fn share_name(share: f64) -> &'static str {
    match share {
        share if share >= 1.0 => "whole",
        share if share >= 0.5 => "half",
        share if share >= 0.25 => "quarter",
        _ => "tenth",
    }
}

/// What paging cost a saturation run, per million client blocks (its `map_cache` report).
fn paging_counts(report: &Value) -> Result<String, String> {
    let written = number(report, "/map_cache/paging/client_blocks_written")?.max(1.0);
    let per_million = |pointer: &str| -> Result<f64, String> { Ok(number(report, pointer)? * 1e6 / written) };
    Ok(format!(
        "per million client blocks {:.0} page reads, {:.0} index pages and {:.0} directory pages written by {:.0} \
         checkpoints; most pages resident {:.0} of a cache of {:.0}",
        per_million("/map_cache/paging/page_loads")?,
        per_million("/map_cache/paging/checkpoint_index_pages")?,
        per_million("/map_cache/paging/checkpoint_directory_pages")?,
        per_million("/map_cache/paging/checkpoints")?,
        number(report, "/map_cache/paging/resident_pages_maximum")?,
        number(report, "/map_cache/paging/cache_pages")?,
    ))
}

fn fio_iops(value: &Value) -> Result<f64, String> {
    Ok(number(value, "/jobs/0/read/iops")? + number(value, "/jobs/0/write/iops")?)
}
