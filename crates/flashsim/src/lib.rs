//! A flash drive model for stripelog's experiments: what happens inside an SSD when it is
//! written randomly, sequentially, or in whole erase blocks, reproduced in virtual time.
//!
//! - [`DriveModel`]: NAND geometry and timings, FTL policy (spare area, greedy garbage
//!   collection with a reserve, wear levelling, trim, write cache, throttle), and presets
//!   for the drive classes of the seeds ([`DriveModel::preset`]).
//! - [`FlashDrive`]: the deterministic simulator. Each request takes an arrival instant
//!   and returns its completion instant; host and NAND writes, erases and their spread
//!   are counted ([`DriveStatistics`], [`EraseSpread`]).
//! - [`FlashDevice`]: a [`FlashDrive`] behind the `BlockDevice` trait, so a stripelog
//!   volume (or any array writer) can sit on simulated drives, on a saturated or a paced
//!   [`Clock`].
//! - [`theory`]: the analytic figures the model is checked against.
//!
//! Design and the presets' sources: docs/flash-simulator.md.
//!
//! ```
//! use stripelog_flashsim::{DriveModel, FlashDrive};
//! let model = DriveModel::preset("enterprise-emlc", 64 << 20).unwrap();
//! let mut drive = FlashDrive::new(model).unwrap();
//! let done = drive.write(0, 1 << 20, 0).unwrap();
//! assert!(done > 0);
//! assert_eq!(drive.statistics().host_write_bytes, 1 << 20);
//! ```

mod device;
mod drive;
mod model;
pub mod theory;

pub use device::{Clock, FlashDevice};
pub use drive::{DriveStatistics, EraseSpread, FlashDrive};
pub use model::{DriveModel, FtlPolicy, NandGeometry, NandTiming, Throttle, PRESET_NAMES};
