//! The interactive view's state and what each key does to it; drawing is
//! `draw`'s job, the terminal `term`'s.

use super::super::model::{functions, processes, thread_functions, threads, History, SortKey};
use super::super::source::Reading;
use super::super::TopArgs;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use rtprof_abi::escape::escape_text;
use rtprof_abi::present::{PresentError, View};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Which table is shown, each one level below the one before: Esc goes
/// up a level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Screen {
    Processes,
    /// One process's functions.
    Functions(u32),
    /// One process's threads (`rtprofd --thread-rows`).
    Threads(u32),
    /// One thread's functions: (pid, tid).
    ThreadFunctions(u32, u32),
}

#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    Continue,
    Quit,
}

/// How long a notice (a restarted daemon) stays up.
const NOTICE_FOR: Duration = Duration::from_secs(5);

/// A selected row: where it is, and which process or function it is.
#[derive(Debug, Default)]
pub struct Selection {
    pub index: usize,
    key: Option<String>,
}

pub struct App {
    pub present: PathBuf,
    pub sort: SortKey,
    /// The filter in force (empty: none).
    pub filter: String,
    /// The filter being typed after `/`, until Enter or Esc.
    pub editing: Option<String>,
    pub screen: Screen,
    /// The selected row of each screen.
    pub processes: Selection,
    pub functions: Selection,
    pub threads: Selection,
    pub thread_functions: Selection,
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
            processes: Selection::default(),
            functions: Selection::default(),
            threads: Selection::default(),
            thread_functions: Selection::default(),
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
        self.follow();
    }

    /// The notice to show now, if any.
    pub fn notice(&self) -> Option<&str> {
        self.notice
            .as_ref()
            .filter(|(_, at)| at.elapsed() < NOTICE_FOR)
            .map(|(n, _)| n.as_str())
    }

    /// What the current screen's rows are, in order: pids, function
    /// names or thread ids.
    fn row_keys(&self) -> Vec<String> {
        let Some(v) = &self.view else {
            return Vec::new();
        };
        let (f, sort) = (&self.filter, self.sort);
        let of = |pid: u32| v.procs.iter().find(|p| p.pid == pid);
        let names = |rows: Vec<&rtprof_abi::present::RowView>| {
            rows.iter().map(|r| r.name.clone()).collect()
        };
        match self.screen {
            Screen::Processes => processes(v, f, sort)
                .iter()
                .map(|s| s.pid.to_string())
                .collect(),
            Screen::Functions(pid) => {
                of(pid).map_or_else(Vec::new, |p| names(functions(v, p, f, sort)))
            }
            Screen::Threads(pid) => of(pid).map_or_else(Vec::new, |p| {
                threads(v, p, f, sort)
                    .iter()
                    .map(|t| t.tid.to_string())
                    .collect()
            }),
            Screen::ThreadFunctions(pid, tid) => {
                of(pid).map_or_else(Vec::new, |p| names(thread_functions(v, p, tid, f, sort)))
            }
        }
    }

    /// Rows of the current screen.
    #[cfg(test)]
    pub fn row_count(&self) -> usize {
        self.row_keys().len()
    }

    fn selection(&mut self) -> &mut Selection {
        match self.screen {
            Screen::Processes => &mut self.processes,
            Screen::Functions(_) => &mut self.functions,
            Screen::Threads(_) => &mut self.threads,
            Screen::ThreadFunctions(..) => &mut self.thread_functions,
        }
    }

    /// Keeps the selection on its process or function wherever a new span
    /// or another order moved it; on the nearest row if it left.
    pub fn follow(&mut self) {
        let keys = self.row_keys();
        let s = self.selection();
        if let Some(i) = s
            .key
            .as_ref()
            .and_then(|k| keys.iter().position(|x| x == k))
        {
            s.index = i;
        }
        s.index = s.index.min(keys.len().saturating_sub(1));
        s.key = keys.get(s.index).cloned();
    }

    fn move_by(&mut self, by: isize) {
        let keys = self.row_keys();
        let s = self.selection();
        s.index = s
            .index
            .saturating_add_signed(by)
            .min(keys.len().saturating_sub(1));
        s.key = keys.get(s.index).cloned();
    }

    /// The process selected in the process list.
    fn selected_pid(&self) -> Option<u32> {
        self.processes.key.as_ref()?.parse().ok()
    }

    /// The thread selected in a thread list.
    fn selected_tid(&self) -> Option<u32> {
        self.threads.key.as_ref()?.parse().ok()
    }

    /// The process whose threads `H` shows: the one shown, or the one
    /// selected in the process list.
    fn threads_of(&self) -> Option<u32> {
        match self.screen {
            Screen::Processes => self.selected_pid(),
            Screen::Functions(pid) | Screen::Threads(pid) | Screen::ThreadFunctions(pid, _) => {
                Some(pid)
            }
        }
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
                    self.processes = Selection::default();
                    self.functions = Selection::default();
                    self.threads = Selection::default();
                    self.thread_functions = Selection::default();
                }
                KeyCode::Esc => self.editing = None,
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Char(c) => text.push(c),
                _ => {}
            }
            // The first row of what the filter leaves is selected now, not
            // at the next span.
            self.follow();
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
        // Commands are plain keys: Ctrl-P or Alt-P (Esc then P typed
        // quickly) is not P.
        if k.modifiers
            .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT)
        {
            return Action::Continue;
        }
        match k.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Char('?') => self.help = true,
            KeyCode::Char('t') => self.sort = SortKey::Time,
            KeyCode::Char('c') => self.sort = SortKey::Calls,
            KeyCode::Char('r') => self.sort = SortKey::Rate,
            KeyCode::Char('n') => self.sort = SortKey::PerCall,
            KeyCode::Char('o') => self.sort = SortKey::Rtprof,
            KeyCode::Char('p') | KeyCode::Char(' ') => {
                self.paused = match self.paused {
                    Some(_) => None,
                    None => Some(rtprof_abi::present::now_ns()),
                }
            }
            KeyCode::Char('/') => self.editing = Some(self.filter.clone()),
            KeyCode::Up | KeyCode::Char('k') => self.move_by(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_by(1),
            KeyCode::PageUp => self.move_by(-10),
            KeyCode::PageDown => self.move_by(10),
            KeyCode::Home | KeyCode::Char('g') => self.move_by(isize::MIN),
            KeyCode::End | KeyCode::Char('G') => self.move_by(isize::MAX),
            KeyCode::Enter => match self.screen {
                Screen::Processes => {
                    if let Some(pid) = self.selected_pid() {
                        self.screen = Screen::Functions(pid);
                        self.functions = Selection::default();
                    }
                }
                Screen::Threads(pid) => {
                    if let Some(tid) = self.selected_tid() {
                        self.screen = Screen::ThreadFunctions(pid, tid);
                        self.thread_functions = Selection::default();
                    }
                }
                _ => {}
            },
            KeyCode::Char('H') => {
                if let Some(pid) = self.threads_of() {
                    if self.screen != Screen::Threads(pid) {
                        self.threads = Selection::default();
                    }
                    self.screen = Screen::Threads(pid);
                }
            }
            KeyCode::Esc | KeyCode::Backspace | KeyCode::Left => match self.screen {
                Screen::Functions(_) => self.screen = Screen::Processes,
                Screen::Threads(pid) => self.screen = Screen::Functions(pid),
                Screen::ThreadFunctions(pid, _) => self.screen = Screen::Threads(pid),
                // Esc on the process list lets go of the filter.
                Screen::Processes => {
                    if k.code == KeyCode::Esc {
                        self.filter.clear();
                    }
                }
            },
            _ => {}
        }
        self.follow();
        Action::Continue
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::top::model::tests::view;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        top: TopArgs,
    }

    /// An app with `args` that has read the model's test view.
    pub fn app(args: &[&str]) -> App {
        let cli = Cli::parse_from(["top"].iter().chain(args));
        let mut a = App::new(&cli.top);
        a.take(Reading::View(view()), false);
        a
    }

    /// Presses `keys`: characters, "\n" Enter, "\x1b" Esc, "\x08" Backspace.
    pub fn press(a: &mut App, keys: &str) -> Action {
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
            ("o", SortKey::Rtprof),
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
        assert_eq!(a.processes.index, 1);
        press(&mut a, "\n");
        assert_eq!(a.screen, Screen::Functions(10));
        assert_eq!(a.row_count(), 4);
        press(&mut a, "G");
        assert_eq!(a.functions.index, 3);
        press(&mut a, "\x1b");
        assert_eq!((a.screen, a.processes.index), (Screen::Processes, 1));
        press(&mut a, "k\n");
        assert_eq!(a.screen, Screen::Functions(20));
        // --pid starts in that process's functions.
        assert_eq!(app(&["--pid", "10"]).screen, Screen::Functions(10));
    }

    /// `H` shows the selected process's threads, Enter one thread's
    /// functions, Esc goes back up a level at a time.
    #[test]
    fn threads_and_a_threads_functions() {
        let mut a = app(&[]);
        // By time: 20, then 10 (which has threads).
        press(&mut a, "jH");
        assert_eq!(a.screen, Screen::Threads(10));
        assert_eq!(a.row_count(), 2);
        press(&mut a, "j\n");
        assert_eq!(a.screen, Screen::ThreadFunctions(10, 12));
        assert_eq!(a.row_count(), 1);
        press(&mut a, "\x1b");
        assert_eq!((a.screen, a.threads.index), (Screen::Threads(10), 1));
        press(&mut a, "k\n");
        assert_eq!(a.screen, Screen::ThreadFunctions(10, 11));
        assert_eq!(a.row_count(), 2);
        press(&mut a, "\x1b\x1b");
        assert_eq!(a.screen, Screen::Functions(10));
        press(&mut a, "H");
        assert_eq!(a.screen, Screen::Threads(10));
        press(&mut a, "\x1b\x1b");
        assert_eq!(a.screen, Screen::Processes);
        // A filter by the thread's name, then its functions.
        press(&mut a, "\x1bH/idle\n");
        assert_eq!((a.screen, a.row_count()), (Screen::Threads(10), 1));
        press(&mut a, "\n");
        assert_eq!(a.screen, Screen::ThreadFunctions(10, 12));
        press(&mut a, "\x1b\x1b\x1b\x1b");
        assert_eq!((a.screen, a.filter.as_str()), (Screen::Processes, ""));
        // A process without rows per thread: an empty list.
        press(&mut a, "kH");
        assert_eq!((a.screen, a.row_count()), (Screen::Threads(20), 0));
        press(&mut a, "\n");
        assert_eq!(a.screen, Screen::Threads(20));
    }

    /// The selection stays on its process when a new span reorders the
    /// list, and on its function when the order changes.
    #[test]
    fn selection_follows_its_row() {
        let mut a = app(&[]);
        // By time: 20, then 10. Select 10.
        press(&mut a, "j");
        assert_eq!(a.selected_pid(), Some(10));
        // A span in which 10 has the most time.
        let mut v = view();
        v.rows[0].time_ns = 5_000_000_000;
        a.take(Reading::View(v), false);
        assert_eq!((a.processes.index, a.selected_pid()), (0, Some(10)));
        press(&mut a, "\n");
        // Functions of 10 by time: cheap (now), costly, middle, fmt.
        press(&mut a, "j");
        assert_eq!(a.functions.key.as_deref(), Some("costly"));
        press(&mut a, "c");
        // By calls: cheap, costly, ... : costly stays selected.
        assert_eq!(
            (a.functions.index, a.functions.key.as_deref()),
            (1, Some("costly"))
        );
        press(&mut a, "n");
        assert_eq!(
            (a.functions.index, a.functions.key.as_deref()),
            (0, Some("costly"))
        );
        press(&mut a, "G");
        assert_eq!(a.functions.index, 3);
        press(&mut a, "g");
        assert_eq!(a.functions.index, 0);
        // The process leaves: nothing to select, nothing breaks.
        let mut v = view();
        v.procs.remove(0);
        v.rows.drain(0..4);
        v.procs[0].rows = 0..1;
        a.take(Reading::View(v), false);
        assert_eq!(a.row_count(), 0);
        press(&mut a, "jk\x1b\n");
        assert_eq!(a.screen, Screen::Functions(20));
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
        let alt_p = KeyEvent::new(KeyCode::Char('p'), KeyModifiers::ALT);
        a.key(alt_p);
        assert!(a.paused.is_none());
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
