//! What a person sees while a test runs: live progress (the summary afterwards is
//! `bloatlab_report::text`).

use bloatlab_units::ms;
use std::fmt::Write as _;
use std::io::Write;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    /// One line rewritten in place (a terminal).
    Live,
    /// A plain line every second (a log file, a pipe).
    Lines,
    Quiet,
}

pub struct Status<'a> {
    pub test: &'a str,
    pub phase: &'a str,
    pub elapsed: f64,
    pub total: f64,
    pub down_mbps: Option<f64>,
    pub up_mbps: Option<f64>,
    pub rtt_ms: Option<f64>,
    /// Flows still in their handshake (behind a full queue that can take seconds).
    pub opening: usize,
}

impl Status<'_> {
    fn line(&self) -> String {
        let mut s = format!(
            "{} {:>5.1}/{:.0} s  {:<5}",
            self.test, self.elapsed, self.total, self.phase
        );
        if let Some(d) = self.down_mbps {
            let _ = write!(s, "  down {d:7.2} Mbit/s");
        }
        if let Some(u) = self.up_mbps {
            let _ = write!(s, "  up {u:7.2} Mbit/s");
        }
        match self.rtt_ms {
            Some(r) => {
                let _ = write!(s, "  rtt {}", ms(r));
            }
            None => s.push_str("  rtt -"),
        }
        if self.opening > 0 {
            let _ = write!(
                s,
                "  opening {} flow{}",
                self.opening,
                if self.opening == 1 { "" } else { "s" }
            );
        }
        s
    }
}

pub struct Progress {
    mode: ProgressMode,
    last_line: f64,
    drawn: bool,
}

impl Progress {
    pub fn new(mode: ProgressMode) -> Self {
        Progress {
            mode,
            last_line: f64::NEG_INFINITY,
            drawn: false,
        }
    }

    pub fn update(&mut self, st: &Status) {
        let mut err = std::io::stderr().lock();
        match self.mode {
            ProgressMode::Quiet => {}
            ProgressMode::Live => {
                let _ = write!(err, "\r\x1b[K{}", st.line());
                let _ = err.flush();
                self.drawn = true;
            }
            ProgressMode::Lines => {
                if st.elapsed - self.last_line >= 1.0 {
                    self.last_line = st.elapsed;
                    let _ = writeln!(err, "{}", st.line());
                }
            }
        }
    }

    pub fn message(&mut self, msg: &str) {
        if self.mode == ProgressMode::Quiet {
            return;
        }
        self.finish();
        eprintln!("{msg}");
    }

    pub fn finish(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }
}
