//! The signals between client writers and the cleaner thread: writers short of room wake
//! it, it says when its rounds gain nothing, its net gain paces the writers
//! (`space::pacing`), and the volume stops it. Its condition variable pairs with the
//! volume's write lock.

use crate::space::pacing::WritePacer;
use parking_lot::Condvar;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

pub(crate) struct CleanerSignals {
    /// Threaded volumes clean in a thread of their own (`cleaner::background_cleaner`):
    /// client writes wake it below the low watermark instead of cleaning themselves.
    background: bool,
    wakeup: Condvar,
    stop: AtomicBool,
    /// The cleaner thread's last round found nothing to gain: writers at the reserve
    /// stop waiting for it and look for space themselves (or report `OutOfSpace`).
    gains_nothing: AtomicBool,
    /// Segments cleaning rounds have emptied less the free segments they took to relocate
    /// into, since the volume opened: the cleaner's own net gain, which client writes do
    /// not move (`cleaner::ProgressWindow`).
    net_segments: AtomicI64,
    /// Client writes paced to what the cleaner thread frees (`space::pacing`).
    pacer: WritePacer,
}

impl CleanerSignals {
    pub(crate) fn new(background: bool, segment_count: u64) -> CleanerSignals {
        CleanerSignals {
            background,
            wakeup: Condvar::new(),
            stop: AtomicBool::new(false),
            gains_nothing: AtomicBool::new(false),
            net_segments: AtomicI64::new(0),
            pacer: WritePacer::new(segment_count),
        }
    }

    /// Whether a cleaner thread cleans (threaded, writable volumes).
    pub(crate) fn background(&self) -> bool {
        self.background
    }

    /// Wake the cleaner thread (callers hold the write lock, whose guard its wait uses).
    pub(crate) fn wake(&self) {
        self.wakeup.notify_one();
    }

    /// Wake every waiter (the cleaner thread, to stop).
    pub(crate) fn wake_all(&self) {
        self.wakeup.notify_all();
    }

    /// The condition the cleaner thread waits on, with the write lock.
    pub(crate) fn wakeup(&self) -> &Condvar {
        &self.wakeup
    }

    /// Ask the cleaner thread to finish its round and end.
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    pub(crate) fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub(crate) fn set_gains_nothing(&self, gains_nothing: bool) {
        self.gains_nothing.store(gains_nothing, Ordering::SeqCst);
    }

    pub(crate) fn gains_nothing(&self) -> bool {
        self.gains_nothing.load(Ordering::SeqCst)
    }

    /// The cleaner's net gain in segments since the volume opened.
    pub(crate) fn net_segments(&self) -> i64 {
        self.net_segments.load(Ordering::SeqCst)
    }

    /// A round emptied `segments` victims.
    pub(crate) fn emptied(&self, segments: u64) {
        self.net_segments.fetch_add(segments as i64, Ordering::SeqCst);
    }

    /// A round took `segments` free segments to relocate into.
    pub(crate) fn took(&self, segments: usize) {
        self.net_segments.fetch_sub(segments as i64, Ordering::SeqCst);
    }

    pub(crate) fn pacer(&self) -> &WritePacer {
        &self.pacer
    }
}
