//! Draws the interactive view: a header (the span, its age, notices), the
//! process list or one process's functions, and a footer with the keys and
//! the legend of the markers; `?` lays the help over it.

use super::super::model::{
    functions, marker, processes, sparkline, thread_functions, threads, SortKey,
};
use super::app::{App, Screen};
use crate::presentation::{age_text, stale_text};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Table, TableState, Wrap};
use ratatui::Frame;
use rtprof_abi::escape::escape_text;
use rtprof_abi::present::{ProcView, RowView, View};
use rtprof_shared::names::readable;

/// The markers' legend, under the keys.
const LEGEND: [(&str, &str); 4] = [
    ("A", "accelerated (calls added through the C API)"),
    ("E", "estimated (overhead budget)"),
    ("S", "sampled only (no call counts)"),
    ("X", "counting switched off"),
];

const KEYS: [(&str, &str); 4] = [
    ("t", "time"),
    ("c", "calls"),
    ("r", "calls/s"),
    ("n", "ns/call"),
];

pub fn draw(f: &mut Frame, app: &App, now: u64) {
    // A paused view is shown as it was when paused, age included.
    let now = app.paused.unwrap_or(now);
    let area = f.area();
    let foot = footer(app, area.width);
    let foot_lines = foot.len() as u16;
    let [head, body, foot_area] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(3),
        Constraint::Length(foot_lines),
    ])
    .areas(area);
    f.render_widget(header(app, now), head);
    match &app.view {
        Some(v) => match app.screen {
            Screen::Processes => process_table(f, app, v, body),
            Screen::Functions(pid) => function_table(f, app, v, pid, body),
            Screen::Threads(pid) => thread_table(f, app, v, pid, body),
            Screen::ThreadFunctions(pid, tid) => thread_function_table(f, app, v, (pid, tid), body),
        },
        None => f.render_widget(
            Paragraph::new(app.problem.clone().unwrap_or_else(|| "reading…".into()))
                .wrap(Wrap { trim: false })
                .block(Block::new().borders(Borders::TOP)),
            body,
        ),
    }
    f.render_widget(Paragraph::new(foot), foot_area);
    if app.help {
        help(f);
    }
}

fn header(app: &App, now: u64) -> Paragraph<'static> {
    // What the user set comes first: it must survive a narrow terminal.
    let mut first = vec![Span::from("rtprof top").bold()];
    if app.paused.is_some() {
        first.push(Span::from("  "));
        first.push(Span::from(" PAUSED ").reversed().bold());
    }
    first.push(Span::from(format!("  sort: {}", app.sort.label())));
    if !app.filter.is_empty() {
        first.push(Span::from(format!(
            "  filter: {}",
            escape_text(&app.filter)
        )));
    }
    if let Some(v) = &app.view {
        first.push(Span::from(format!(
            "  │ {} process(es), span {:.1} s, generation {}, published {} ago",
            v.procs.len(),
            v.span_ns as f64 / 1e9,
            v.generation,
            age_text(v.age(now).0)
        )));
    }
    // One line of what is wrong: a problem, the table's age, a restart.
    let second = if let (Some(p), Some(_)) = (&app.problem, &app.view) {
        Line::from(p.clone()).red()
    } else if let Some(s) = app.view.as_ref().and_then(|v| stale_text(v, now)) {
        Line::from(s).red().bold()
    } else if let Some(n) = app.notice() {
        Line::from(n.to_string()).yellow()
    } else {
        Line::default()
    };
    Paragraph::new(vec![Line::from(first), second])
}

/// Lines of `items` laid side by side, a new line where the next would
/// run off a terminal `width` wide.
fn pack(items: impl IntoIterator<Item = Line<'static>>, width: u16) -> Vec<Line<'static>> {
    let mut lines = vec![Line::default()];
    for item in items {
        let last = lines.last_mut().expect("one line at least");
        if last.width() > 0 && last.width() + item.width() > width as usize {
            lines.push(item);
        } else {
            last.spans.extend(item.spans);
        }
    }
    lines
}

/// The footer's lines for a terminal `width` wide: the keys (or the filter
/// being typed), then the markers' legend; what does not fit goes on
/// another line rather than off the edge.
fn footer(app: &App, width: u16) -> Vec<Line<'static>> {
    let legend = pack(
        LEGEND.map(|(m, what)| {
            Line::from(vec![
                Span::from(m).bold(),
                Span::from(format!(" {what}  ")).dim(),
            ])
        }),
        width,
    );
    if let Some(text) = &app.editing {
        let typing = Line::from(vec![
            Span::from("filter: ").bold(),
            Span::from(format!("{}▏", escape_text(text))),
            Span::from("   Enter apply   Esc cancel").dim(),
        ]);
        return [typing].into_iter().chain(legend).collect();
    }
    let sorted = |what: &str| {
        if app.sort.label() == what {
            Style::new().reversed()
        } else {
            Style::new()
        }
    };
    let (enter, back) = match app.screen {
        Screen::Processes => ("Enter", "functions"),
        Screen::Threads(_) => ("Enter", "its functions  Esc back"),
        Screen::Functions(_) | Screen::ThreadFunctions(..) => ("Esc", "back"),
    };
    let pause = if app.paused.is_some() {
        "resume"
    } else {
        "pause"
    };
    let items = KEYS.iter().map(|&(k, what)| (k, what, sorted(what))).chain(
        [
            ("/", "filter"),
            ("↑↓", "select"),
            (enter, back),
            ("H", "threads"),
            ("p", pause),
            ("?", "help"),
            ("q", "quit"),
        ]
        .map(|(k, what)| (k, what, Style::new())),
    );
    let keys = items.map(|(key, what, style)| {
        Line::from(vec![
            Span::from(key).bold(),
            Span::styled(format!(" {what}"), style),
            Span::from("  "),
        ])
    });
    pack(keys, width).into_iter().chain(legend).collect()
}

fn per_call_text(n: Option<f64>) -> String {
    n.map_or("-".into(), |n| format!("{n:.1}"))
}

fn selected() -> Style {
    Style::new()
        .bg(Color::Blue)
        .fg(Color::White)
        .add_modifier(Modifier::BOLD)
}

/// An executable by its file name, then where it is (dimmed), so that a
/// narrow column still shows which program it is.
fn executable(exe: &str, ended: bool) -> Line<'static> {
    let (dir, name) = match exe.rsplit_once('/') {
        Some((dir, name)) if !name.is_empty() => (format!(" {dir}/"), name),
        _ => (String::new(), exe),
    };
    let mut spans = vec![Span::from(escape_text(name).into_owned())];
    if ended {
        spans.push(Span::from(" (ended)"));
    }
    spans.push(Span::from(escape_text(&dir).into_owned()).dim());
    Line::from(spans)
}

/// Terminals at least this wide get the columns marked `wide_only`.
const WIDE: u16 = 100;

/// A table's column: its header, its width, and whether only a wide
/// terminal shows it (names need the room more than sparklines do).
struct Column {
    head: &'static str,
    width: Constraint,
    wide_only: bool,
}

const fn col(head: &'static str, width: Constraint, wide_only: bool) -> Column {
    Column {
        head,
        width,
        wide_only,
    }
}

/// A table of `rows` (a cell per column) with the columns `width` has
/// room for.
fn table<'a>(columns: &[Column], rows: Vec<Vec<Cell<'a>>>, width: u16, title: String) -> Table<'a> {
    let shown: Vec<bool> = columns
        .iter()
        .map(|c| width >= WIDE || !c.wide_only)
        .collect();
    let keep = |cells: Vec<Cell<'a>>| {
        cells
            .into_iter()
            .zip(&shown)
            .filter(|(_, &s)| s)
            .map(|(c, _)| c)
            .collect::<Vec<_>>()
    };
    let widths: Vec<Constraint> = columns
        .iter()
        .zip(&shown)
        .filter(|(_, &s)| s)
        .map(|(c, _)| c.width)
        .collect();
    let header = Row::new(keep(columns.iter().map(|c| Cell::from(c.head)).collect()))
        .style(Style::new().bold().underlined());
    Table::new(rows.into_iter().map(|r| Row::new(keep(r))), widths)
        .header(header)
        .block(Block::new().borders(Borders::TOP).title(title))
        .row_highlight_style(selected())
}

// Numbers keep their widths; names get what is left.
const PROCESS_COLUMNS: [Column; 9] = [
    col("", Constraint::Length(3), false),
    col("pid", Constraint::Length(7), false),
    col("executable", Constraint::Fill(1), false),
    col("time ms", Constraint::Length(9), false),
    col("calls/s", Constraint::Length(11), false),
    col("ns/call", Constraint::Length(12), false),
    col("rtprof", Constraint::Length(7), true),
    col("funcs", Constraint::Length(5), true),
    col("recent spans", Constraint::Length(16), true),
];

// The function gets three times the module's share of what is left.
const FUNCTION_COLUMNS: [Column; 8] = [
    col("", Constraint::Length(3), false),
    col("time ms", Constraint::Length(9), false),
    col("calls", Constraint::Length(11), true),
    col("calls/s", Constraint::Length(11), false),
    col("ns/call", Constraint::Length(12), false),
    col("recent spans", Constraint::Length(16), true),
    col("function", Constraint::Fill(3), false),
    col("module", Constraint::Fill(1), true),
];

fn process_table(f: &mut Frame, app: &App, v: &View, area: Rect) {
    let ps = processes(v, &app.filter, app.sort);
    let rows: Vec<Vec<Cell>> = ps
        .iter()
        .map(|s| {
            let spark = app
                .history
                .process(s.pid)
                .map(sparkline)
                .unwrap_or_default();
            vec![
                Cell::from(s.markers.clone()),
                Cell::from(s.pid.to_string()),
                Cell::from(executable(&s.exe, s.ended)),
                Cell::from(format!("{:.1}", s.time_ns as f64 / 1e6)),
                Cell::from(format!("{:.1}", s.calls_per_s())),
                Cell::from(per_call_text(s.ns_per_call())),
                Cell::from(
                    s.rtprof_share()
                        .map_or("-".to_string(), |x| format!("{:.1}%", x * 100.0)),
                ),
                Cell::from(s.functions.to_string()),
                Cell::from(spark),
            ]
        })
        .collect();
    let empty = rows.is_empty();
    let title = if empty && !app.filter.is_empty() {
        format!(" processes: none match {:?} (Esc clears) ", app.filter)
    } else {
        format!(" processes ({}) ", ps.len())
    };
    let t = table(&PROCESS_COLUMNS, rows, area.width, title);
    let mut state = TableState::new().with_selected((!empty).then_some(app.processes.index));
    f.render_stateful_widget(t, area, &mut state);
}

/// Says `text` in place of a table.
fn say(f: &mut Frame, text: String, area: Rect) {
    f.render_widget(
        Paragraph::new(text)
            .wrap(Wrap { trim: false })
            .block(Block::new().borders(Borders::TOP)),
        area,
    );
}

/// A process that left the span: said in place of its table.
fn gone(f: &mut Frame, pid: u32, area: Rect) {
    say(
        f,
        format!("process {pid} is not in this span (it ended): Esc goes back"),
        area,
    );
}

/// A function row's cells (its process `p`'s, with its recent spans if
/// `spark`).
fn function_cells<'a>(app: &App, p: &ProcView, r: &RowView, spark: bool) -> Vec<Cell<'a>> {
    let spark = spark
        .then(|| app.history.function(p.pid, &r.name).map(sparkline))
        .flatten()
        .unwrap_or_default();
    vec![
        Cell::from(marker(r)),
        Cell::from(format!("{:.1}", r.time_ns as f64 / 1e6)),
        Cell::from(if r.counted {
            r.calls.to_string()
        } else {
            "-".into()
        }),
        Cell::from(format!("{:.1}", r.calls_per_s(p.span_ns))),
        Cell::from(per_call_text(r.ns_per_call())),
        Cell::from(spark),
        Cell::from(escape_text(&crate::top::model::shown_name(r)).into_owned()),
        Cell::from(escape_text(&r.module).into_owned()).dim(),
    ]
}

fn function_table(f: &mut Frame, app: &App, v: &View, pid: u32, area: Rect) {
    let Some(p) = v.procs.iter().find(|p| p.pid == pid) else {
        return gone(f, pid, area);
    };
    let rows: Vec<Vec<Cell>> = functions(v, p, &app.filter, app.sort)
        .into_iter()
        .map(|r| function_cells(app, p, r, true))
        .collect();
    let n = rows.len();
    let title = format!(
        " pid {} {}{}: {} function(s), {} samples ",
        p.pid,
        escape_text(&p.exe),
        if p.ended { " (ended)" } else { "" },
        n,
        p.samples
    );
    let t = table(&FUNCTION_COLUMNS, rows, area.width, title);
    let mut state = TableState::new().with_selected((n > 0).then_some(app.functions.index));
    f.render_stateful_widget(t, area, &mut state);
}

const THREAD_COLUMNS: [Column; 6] = [
    col("tid", Constraint::Length(8), false),
    col("thread", Constraint::Fill(1), false),
    col("time ms", Constraint::Length(9), false),
    col("calls", Constraint::Length(11), false),
    col("calls/s", Constraint::Length(11), true),
    col("hottest function", Constraint::Fill(2), true),
];

fn thread_table(f: &mut Frame, app: &App, v: &View, pid: u32, area: Rect) {
    let Some(p) = v.procs.iter().find(|p| p.pid == pid) else {
        return gone(f, pid, area);
    };
    if p.threads.is_empty() {
        let text = format!(
            "no rows per thread for pid {pid}: rtprofd publishes them when started with \
             --thread-rows N (threads with calls or samples in the span). Esc goes back"
        );
        return say(f, text, area);
    }
    let ts = threads(v, p, &app.filter, app.sort);
    let rows: Vec<Vec<Cell>> = ts
        .iter()
        .map(|t| {
            let hottest = t
                .hottest(v)
                .map(|r| escape_text(&readable(&r.name)).into_owned())
                .unwrap_or_default();
            let per_s = if p.span_ns == 0 {
                0.0
            } else {
                t.calls as f64 * 1e9 / p.span_ns as f64
            };
            vec![
                Cell::from(t.tid.to_string()),
                Cell::from(escape_text(&t.name).into_owned()),
                Cell::from(format!("{:.1}", t.time_ns as f64 / 1e6)),
                Cell::from(t.calls.to_string()),
                Cell::from(format!("{per_s:.1}")),
                Cell::from(hottest),
            ]
        })
        .collect();
    let n = rows.len();
    let title = format!(" pid {} {}: {} thread(s) ", p.pid, escape_text(&p.exe), n);
    let t = table(&THREAD_COLUMNS, rows, area.width, title);
    let mut state = TableState::new().with_selected((n > 0).then_some(app.threads.index));
    f.render_stateful_widget(t, area, &mut state);
}

fn thread_function_table(f: &mut Frame, app: &App, v: &View, (pid, tid): (u32, u32), area: Rect) {
    let Some(p) = v.procs.iter().find(|p| p.pid == pid) else {
        return gone(f, pid, area);
    };
    let Some(t) = p.threads.iter().find(|t| t.tid == tid) else {
        let text = format!(
            "thread {tid} of pid {pid} has no rows in this span (it ended, or ran nothing): \
             Esc goes back"
        );
        return say(f, text, area);
    };
    let rows: Vec<Vec<Cell>> = thread_functions(v, p, tid, &app.filter, app.sort)
        .into_iter()
        .map(|r| function_cells(app, p, r, false))
        .collect();
    let n = rows.len();
    let title = format!(
        " pid {} thread {} {}: {} function(s), {:.1} ms ",
        p.pid,
        tid,
        escape_text(&t.name),
        n,
        t.time_ns as f64 / 1e6
    );
    let t = table(&FUNCTION_COLUMNS, rows, area.width, title);
    let mut state = TableState::new().with_selected((n > 0).then_some(app.thread_functions.index));
    f.render_stateful_widget(t, area, &mut state);
}

fn help(f: &mut Frame) {
    let sort = |k: SortKey| format!("sort by {}", k.label());
    let lines: Vec<Line> = [
        ("t", sort(SortKey::Time)),
        ("c", sort(SortKey::Calls)),
        ("r", sort(SortKey::Rate)),
        ("n", sort(SortKey::PerCall)),
        ("o", sort(SortKey::Rtprof)),
        (
            "/",
            "filter by executable or function (Enter applies, Esc cancels)".into(),
        ),
        ("↑ ↓ j k", "select a row (PgUp PgDn Home End too)".into()),
        (
            "Enter",
            "a process's functions, a thread's functions".into(),
        ),
        ("H", "the process's threads (rtprofd --thread-rows)".into()),
        (
            "Esc",
            "back up a level; on the processes, drop the filter".into(),
        ),
        (
            "p, space",
            "pause (the view stops updating) / resume".into(),
        ),
        ("?", "this help (any key closes it)".into()),
        ("q, Ctrl-C", "quit".into()),
    ]
    .into_iter()
    .map(|(k, what)| {
        Line::from(vec![
            Span::from(format!("{k:>11}  ")).bold(),
            Span::from(what),
        ])
    })
    .chain([
        Line::default(),
        Line::from("  A  accelerated: the program adds its calls through the C API"),
        Line::from("  E  calls estimated under the overhead budget (exact in bursts)"),
        Line::from("  S  sampled only: time from samples, no call counts"),
        Line::from("  X  counting switched off (rtprof switch, rtprof_set_counting)"),
        Line::from("     (blank: every call counted)"),
        Line::default(),
        Line::from("  recent spans: each row's time over the last 16 spans").dim(),
    ])
    .collect();
    let area = f.area();
    let h = (lines.len() as u16 + 2).min(area.height);
    let w = 78.min(area.width);
    let r = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" rtprof top: help ")),
        r,
    );
}

#[cfg(test)]
mod tests {
    use super::super::app::tests::{app, press};
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    /// The screen `app` draws at `now` on a `w` x `h` terminal, as lines.
    fn screen(app: &App, now: u64, w: u16, h: u16) -> Vec<String> {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| draw(f, app, now)).unwrap();
        let b = t.backend().buffer();
        (0..h)
            .map(|y| {
                (0..w)
                    .map(|x| b[(x, y)].symbol())
                    .collect::<String>()
                    .trim_end()
                    .to_string()
            })
            .collect()
    }

    fn line<'a>(s: &'a [String], text: &str) -> &'a str {
        s.iter()
            .find(|l| l.contains(text))
            .unwrap_or_else(|| panic!("no {text:?} in\n{}", s.join("\n")))
    }

    #[test]
    fn process_list_with_markers_keys_and_legend() {
        let a = app(&[]);
        let s = screen(&a, 0, 120, 20);
        assert!(
            s[0].starts_with("rtprof top  sort: time  │ 2 process(es)"),
            "{}",
            s[0]
        );
        // Sorted by time: /bin/dear first; /bin/cheap has an estimated row.
        let (dear, cheap) = (line(&s, "dear"), line(&s, "cheap"));
        assert!(s.iter().position(|l| l == dear) < s.iter().position(|l| l == cheap));
        assert!(cheap.starts_with("E ") && cheap.contains(" 10 "), "{cheap}");
        assert!(dear.trim_start().starts_with("20 "), "{dear}");
        assert!(line(&s, "t time").contains("q quit"));
        line(&s, "A accelerated (calls added through the C API)");
        line(&s, "X counting switched off");
        line(&s, "recent spans");
    }

    #[test]
    fn functions_paused_help_and_stale() {
        let mut a = app(&[]);
        press(&mut a, "j\n");
        let s = screen(&a, 0, 120, 20);
        assert!(line(&s, "pid 10 /bin/cheap").contains("4 function(s)"));
        assert!(line(&s, " costly ").starts_with("E "));
        assert!(line(&s, " middle ").starts_with("S "));
        assert!(line(&s, "core::fmt::write").starts_with("  "));
        assert!(line(&s, "Esc back").contains("t time"));
        press(&mut a, "p");
        assert!(screen(&a, 0, 120, 20)[0].contains("PAUSED"));
        press(&mut a, "p?");
        let s = screen(&a, 0, 120, 30);
        assert!(line(&s, "rtprof top: help").contains('┌'));
        line(&s, "sort by ns/call");
        // Ten seconds after a publish of a daemon ticking every second.
        let a = app(&[]);
        let s = screen(&a, 10_000_000_000, 120, 20);
        assert!(
            s[1].starts_with("STALE: nothing new for 10.0 s"),
            "{}",
            s[1]
        );
    }

    #[test]
    fn threads_and_a_threads_functions() {
        let mut a = app(&[]);
        press(&mut a, "jH");
        let s = screen(&a, 0, 120, 20);
        assert!(line(&s, "pid 10 /bin/cheap").contains("2 thread(s)"));
        let worker = line(&s, "worker");
        assert!(worker.trim_start().starts_with("11 "), "{worker}");
        assert!(
            worker.contains(" 450.0 ") && worker.contains("900060"),
            "{worker}"
        );
        assert!(worker.ends_with("costly"), "{worker}");
        line(&s, "Enter its functions");
        press(&mut a, "\n");
        let s = screen(&a, 0, 120, 20);
        assert!(line(&s, "thread 11 worker").contains("2 function(s), 450.0 ms"));
        assert!(line(&s, " costly ").contains(" 400.0 "));
        // A process without rows per thread says how to get them.
        press(&mut a, "\x1b\x1b\x1bkH");
        let s = screen(&a, 0, 120, 20);
        line(&s, "--thread-rows N");
    }

    #[test]
    fn narrow_and_tiny_terminals() {
        let mut a = app(&[]);
        let s = screen(&a, 0, 60, 20);
        // The keys wrap rather than run off the edge.
        assert!(!line(&s, "t time").contains("q quit"));
        line(&s, "q quit");
        // The file name of an executable comes before its directory; the
        // sparklines make room.
        line(&s, "dear /bin/");
        assert!(!s.join("\n").contains("recent spans"));
        press(&mut a, "\n");
        let s = screen(&a, 0, 60, 20);
        assert!(line(&s, "solo").starts_with("    900.0 "));
        assert!(!s.join("\n").contains("module"));
        for (w, h) in [(1, 1), (10, 3), (30, 5)] {
            a.help = true;
            screen(&a, 0, w, h);
            a.help = false;
            screen(&a, 0, w, h);
        }
    }

    #[test]
    fn waiting_for_the_daemon() {
        let mut a = app(&[]);
        a.view = None;
        a.problem = Some("waiting for rtprofd at /run/x: nothing published yet".into());
        let s = screen(&a, 0, 80, 10);
        line(&s, "waiting for rtprofd at /run/x");
    }
}
