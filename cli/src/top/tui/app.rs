//! The interactive view's state and what each key does to it; drawing is
//! `draw`'s job, the terminal `term`'s.

use super::super::model::{functions, processes, History, SortKey};
use super::super::source::Reading;
use super::super::TopArgs;
use rtprof_shared::present::{PresentError, View};
use rtprof_shared::report::escape_text;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

/// Which table is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Screen {
    Processes,
    /// One process's functions.
    Functions(u32),
}

#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    Continue,
    Quit,
}

/// How long a notice (a restarted daemon) stays up.
const NOTICE_FOR: Duration = Duration::from_secs(5);

pub struct App {
    pub present: PathBuf,
    pub sort: SortKey,
    /// The filter in force (empty: none).
    pub filter: String,
    /// The filter being typed after `/`, until Enter or Esc.
    pub editing: Option<String>,
    pub screen: Screen,
    /// The selected row of each screen.
    pub proc_cursor: usize,
    pub fn_cursor: usize,
    /// Paused at this clock (CLOCK_REALTIME ns): the view, its age
    /// included, stays as it was then.
    pub paused: Option<u64>,
    pub help: bool,
    /// The last table read, and the history of the ones before.
    pub view: Option<View>,
    pub history: History,
    last_generation: u64,
    /// Why there is no current table (no daemon yet, a broken segment).
    pub problem: Option<String>,
    pub notice: Option<(String, Instant)>,
}

impl App {
    pub fn new(a: &TopArgs) -> App {
        App {
            present: a.present.clone(),
            sort: a.sort,
            filter: a.name.clone().unwrap_or_default(),
            editing: None,
            screen: a.pid.map_or(Screen::Processes, Screen::Functions),
            proc_cursor: 0,
            fn_cursor: 0,
            paused: None,
            help: false,
            view: None,
            history: History::default(),
            last_generation: 0,
            problem: None,
            notice: None,
        }
    }

    /// Takes in what the source read.
    pub fn take(&mut self, reading: Reading, restarted: bool) {
        let path = escape_text(&self.present.to_string_lossy()).into_owned();
        if restarted {
            self.history.clear();
            self.last_generation = 0;
            self.notice = Some((
                format!("rtprofd restarted: re-opened {path}"),
                Instant::now(),
            ));
        }
        match reading {
            Reading::View(v) => {
                if v.generation != self.last_generation {
                    if v.generation < self.last_generation {
                        // The segment was re-initialised in place.
                        self.history.clear();
                    }
                    self.history.record(&v);
                    self.last_generation = v.generation;
                }
                self.view = Some(v);
                self.problem = None;
            }
            Reading::Busy => {}
            Reading::Absent(e) => {
                // The error names the path too: once is enough.
                let why = match e {
                    crate::error::Error::PresentOpen { source, .. } => source.to_string(),
                    e => e.to_string(),
                };
                self.problem = Some(format!("waiting for rtprofd at {path}: {why}"));
            }
            Reading::Failed(PresentError::NotPublished) => {
                self.problem = Some(format!(
                    "waiting for rtprofd at {path}: nothing published yet"
                ));
            }
            Reading::Failed(e) => self.problem = Some(format!("{path}: {e}")),
        }
    }

    /// The notice to show now, if any.
    pub fn notice(&self) -> Option<&str> {
        self.notice
            .as_ref()
            .filter(|(_, at)| at.elapsed() < NOTICE_FOR)
            .map(|(n, _)| n.as_str())
    }

    /// Rows of the current screen.
    pub fn row_count(&self) -> usize {
        let Some(v) = &self.view else { return 0 };
        match self.screen {
            Screen::Processes => processes(v, &self.filter, self.sort).len(),
            Screen::Functions(pid) => v
                .procs
                .iter()
                .find(|p| p.pid == pid)
                .map_or(0, |p| functions(v, p, &self.filter, self.sort).len()),
        }
    }

    fn cursor(&mut self) -> &mut usize {
        match self.screen {
            Screen::Processes => &mut self.proc_cursor,
            Screen::Functions(_) => &mut self.fn_cursor,
        }
    }

    /// Keeps the selection on a row that exists.
    pub fn clamp(&mut self) {
        let n = self.row_count();
        let c = self.cursor();
        *c = (*c).min(n.saturating_sub(1));
    }

    fn move_by(&mut self, by: isize) {
        let n = self.row_count();
        let c = self.cursor();
        *c = c.saturating_add_signed(by).min(n.saturating_sub(1));
    }

    /// The process under the cursor of the process list.
    fn selected_pid(&self) -> Option<u32> {
        let v = self.view.as_ref()?;
        processes(v, &self.filter, self.sort)
            .get(self.proc_cursor)
            .map(|s| s.pid)
    }

    pub fn key(&mut self, k: KeyEvent) -> Action {
        if k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        if let Some(text) = &mut self.editing {
            match k.code {
                KeyCode::Enter => {
                    self.filter = std::mem::take(text);
                    self.editing = None;
                    self.proc_cursor = 0;
                    self.fn_cursor = 0;
                }
                KeyCode::Esc => self.editing = None,
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Char(c) => text.push(c),
                _ => {}
            }
            return Action::Continue;
        }
        if self.help {
            // Any key closes the help, and q still quits.
            self.help = false;
            return if k.code == KeyCode::Char('q') {
                Action::Quit
            } else {
                Action::Continue
            };
        }
        match k.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Char('?') => self.help = true,
            KeyCode::Char('t') => self.sort = SortKey::Time,
            KeyCode::Char('c') => self.sort = SortKey::Calls,
            KeyCode::Char('r') => self.sort = SortKey::Rate,
            KeyCode::Char('n') => self.sort = SortKey::PerCall,
            KeyCode::Char('p') | KeyCode::Char(' ') => {
                self.paused = match self.paused {
                    Some(_) => None,
                    None => Some(rtprof_shared::present::now_ns()),
                }
            }
            KeyCode::Char('/') => self.editing = Some(self.filter.clone()),
            KeyCode::Up | KeyCode::Char('k') => self.move_by(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_by(1),
            KeyCode::PageUp => self.move_by(-10),
            KeyCode::PageDown => self.move_by(10),
            KeyCode::Home | KeyCode::Char('g') => *self.cursor() = 0,
            KeyCode::End | KeyCode::Char('G') => self.move_by(isize::MAX),
            KeyCode::Enter => {
                if let (Screen::Processes, Some(pid)) = (self.screen, self.selected_pid()) {
                    self.screen = Screen::Functions(pid);
                    self.fn_cursor = 0;
                }
            }
            KeyCode::Esc | KeyCode::Backspace | KeyCode::Left => match self.screen {
                Screen::Functions(_) => self.screen = Screen::Processes,
                // Esc on the process list lets go of the filter.
                Screen::Processes => {
                    if k.code == KeyCode::Esc {
                        self.filter.clear();
                    }
                }
            },
            _ => {}
        }
        self.clamp();
        Action::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::model::tests::view;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        top: TopArgs,
    }

    fn app(args: &[&str]) -> App {
        let cli = Cli::parse_from(["top"].iter().chain(args));
        let mut a = App::new(&cli.top);
        a.take(Reading::View(view()), false);
        a
    }

    fn press(a: &mut App, keys: &str) -> Action {
        let mut last = Action::Continue;
        for c in keys.chars() {
            let code = match c {
                '\n' => KeyCode::Enter,
                '\x1b' => KeyCode::Esc,
                '\x08' => KeyCode::Backspace,
                c => KeyCode::Char(c),
            };
            last = a.key(KeyEvent::new(code, KeyModifiers::NONE));
        }
        last
    }

    #[test]
    fn sort_keys() {
        let mut a = app(&[]);
        for (k, s) in [
            ("c", SortKey::Calls),
            ("r", SortKey::Rate),
            ("n", SortKey::PerCall),
            ("t", SortKey::Time),
        ] {
            press(&mut a, k);
            assert_eq!(a.sort, s);
        }
    }

    #[test]
    fn filter_applies_on_enter_and_esc_cancels() {
        let mut a = app(&[]);
        press(&mut a, "/che");
        assert_eq!(a.editing.as_deref(), Some("che"));
        // Not in force while typed: keys are text, not commands.
        assert_eq!((a.filter.as_str(), a.sort), ("", SortKey::Time));
        press(&mut a, "apq\x08\n");
        assert_eq!((a.filter.as_str(), a.editing.as_deref()), ("cheap", None));
        assert_eq!(a.row_count(), 1);
        press(&mut a, "/xyz\x1b");
        assert_eq!(a.filter, "cheap");
        // Esc on the process list drops the filter.
        press(&mut a, "\x1b");
        assert_eq!((a.filter.as_str(), a.row_count()), ("", 2));
    }

    #[test]
    fn select_drill_in_and_back() {
        let mut a = app(&[]);
        // By time: /bin/dear (20) first, then /bin/cheap (10).
        press(&mut a, "jjj");
        assert_eq!(a.proc_cursor, 1);
        press(&mut a, "\n");
        assert_eq!(a.screen, Screen::Functions(10));
        assert_eq!(a.row_count(), 4);
        press(&mut a, "G");
        assert_eq!(a.fn_cursor, 3);
        press(&mut a, "\x1b");
        assert_eq!((a.screen, a.proc_cursor), (Screen::Processes, 1));
        press(&mut a, "k\n");
        assert_eq!(a.screen, Screen::Functions(20));
        // --pid starts in that process's functions.
        assert_eq!(app(&["--pid", "10"]).screen, Screen::Functions(10));
    }

    #[test]
    fn pause_help_and_quit() {
        let mut a = app(&["--name", "dear"]);
        assert_eq!(a.row_count(), 1);
        press(&mut a, "p");
        assert!(a.paused.is_some());
        press(&mut a, " ");
        assert!(a.paused.is_none());
        press(&mut a, "?");
        assert!(a.help);
        // A key closes the help without doing anything else.
        assert_eq!(press(&mut a, "c"), Action::Continue);
        assert!(!a.help && a.sort == SortKey::Time);
        assert_eq!(press(&mut a, "q"), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        a.editing = Some(String::new());
        assert_eq!(a.key(ctrl_c), Action::Quit);
    }

    #[test]
    fn waiting_and_restarts_are_said() {
        let cli = Cli::parse_from(["top", "--present", "/nowhere/present"]);
        let mut a = App::new(&cli.top);
        let e = crate::presentation::open(std::path::Path::new("/nowhere/present"))
            .err()
            .unwrap();
        a.take(Reading::Absent(e), false);
        let p = a.problem.clone().unwrap();
        assert!(
            p.starts_with("waiting for rtprofd at /nowhere/present"),
            "{p}"
        );
        a.take(Reading::View(view()), true);
        assert!(a.problem.is_none());
        assert!(a.notice().unwrap().contains("restarted"));
        assert_eq!(a.history.process(10).map(|h| h.len()), Some(1));
    }
}
