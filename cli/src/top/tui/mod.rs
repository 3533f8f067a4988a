//! The interactive `rtprof top`: reads the segment every 100 ms (unless
//! paused), redraws after every read, key and resize, and gives the
//! terminal back when it ends.

mod app;
mod draw;
mod term;

use super::source::Source;
use super::TopArgs;
use app::{Action, App};
use ratatui::crossterm::event::{self, Event, KeyEventKind};
use rtprof_abi::present::now_ns;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How often the segment is read.
const READ_EVERY: Duration = Duration::from_millis(100);

pub fn run(a: TopArgs) -> ExitCode {
    let mut guard = match term::enter() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("rtprof: cannot use the terminal: {e}");
            return ExitCode::from(1);
        }
    };
    let result = run_in(&mut guard.terminal, &a);
    drop(guard);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rtprof: terminal: {e}");
            ExitCode::from(1)
        }
    }
}

fn run_in(t: &mut term::Tui, a: &TopArgs) -> std::io::Result<()> {
    let mut app = App::new(a);
    let mut source = Source::waiting(&a.present);
    let mut next_read = Instant::now();
    loop {
        if app.paused.is_none() && Instant::now() >= next_read {
            let (reading, restarted) = source.read();
            app.take(reading, restarted);
            next_read = Instant::now() + READ_EVERY;
        }
        t.draw(|f| draw::draw(f, &app, now_ns()))?;
        // Wait for a key until the next read (paused: there is none); a
        // resize just redraws.
        let wait = if app.paused.is_some() {
            Duration::from_secs(1)
        } else {
            next_read.saturating_duration_since(Instant::now())
        };
        if event::poll(wait)? {
            if let Event::Key(k) = event::read()? {
                if k.kind != KeyEventKind::Release && app.key(k) == Action::Quit {
                    return Ok(());
                }
            }
        }
    }
}
