//! The terminal while the interactive view runs: raw mode, the alternate
//! screen and a hidden cursor, all given back when the view ends, however
//! it ends (a panic included).

use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use ratatui::crossterm::{cursor, execute};
use ratatui::Terminal;
use std::io::{self, Stdout};
use std::sync::atomic::{AtomicBool, Ordering};

pub type Tui = Terminal<CrosstermBackend<Stdout>>;

/// The terminal taken over; given back on drop.
pub struct Guard {
    pub terminal: Tui,
}

/// Whether the terminal is taken over now.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// Puts the terminal back as it was, once: the panic hook and then the
/// guard both call it, and leaving the alternate screen a second time
/// would move the cursor back over the panic's message.
pub fn restore() {
    if TAKEN.swap(false, Ordering::SeqCst) {
        let _ = disable_raw_mode();
        let _ = execute!(io::stdout(), LeaveAlternateScreen, cursor::Show);
    }
}

/// Takes the terminal over, and makes a panic give it back before the
/// panic's message is printed (on the alternate screen it would be lost,
/// and a shell left in raw mode is unusable).
pub fn enter() -> io::Result<Guard> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        previous(info);
    }));
    let setup = || -> io::Result<Tui> {
        TAKEN.store(true, Ordering::SeqCst);
        enable_raw_mode()?;
        execute!(io::stdout(), EnterAlternateScreen, cursor::Hide)?;
        Terminal::new(CrosstermBackend::new(io::stdout()))
    };
    match setup() {
        Ok(terminal) => Ok(Guard { terminal }),
        Err(e) => {
            restore();
            Err(e)
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
    }
}
