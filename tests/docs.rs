//! The docs stay true: the reference pages are what the code generates
//! today, every relative link in README.md and docs/ points at something
//! inside the repository, every code block is closed where it should be
//! (GitHub renders the rest of a page as code otherwise), a CommonMark
//! parser renders every page as written (pulldown-cmark), and the README
//! stays short.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_reference_pages_are_what_the_code_generates() {
    let dir = root().join("docs/reference");
    let pages = spot_node_manager::reference::pages().expect("reference pages");
    let mut expected = BTreeSet::new();
    for (file, text) in &pages {
        expected.insert(file.to_string());
        let committed = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        assert!(
            committed == *text,
            "docs/reference/{file} differs from the code's descriptions: run `cargo run -- reference --out-dir docs/reference` and commit it"
        );
    }
    for entry in std::fs::read_dir(&dir).expect("docs/reference") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .to_string();
        assert!(
            expected.contains(&name),
            "docs/reference/{name} is not generated: remove it, or generate it"
        );
    }
}

#[test]
fn the_rule_book_in_the_disruption_page_is_the_code_s() {
    let page = root().join("docs/concepts/disruption.md");
    let text = std::fs::read_to_string(&page).expect("docs/concepts/disruption.md");
    let spliced = spot_node_manager::controllers::authority::rules::splice(&text)
        .expect("the page has the rule book's markers");
    assert!(
        spliced == text,
        "docs/concepts/disruption.md's rule book differs from the code's: run `cargo run -- reference --out-dir docs/reference` and commit it"
    );
    // The table is there, one row per reason.
    let rows = text.lines().filter(|l| l.starts_with("| ")).count();
    assert!(
        rows > spot_node_manager::controllers::authority::rules::Reason::ALL.len(),
        "{rows} table rows"
    );
}

/// Every Markdown file of the docs: README.md and docs/**.md.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The targets of the inline links `[text](target)` of `text`, outside
/// fenced code blocks and inline code.
fn links(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code may hold `[a](b)` that is no link.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let Some(end) = tail.find(')') else { break };
            out.push(tail[..end].trim().to_string());
            rest = &tail[end..];
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces
/// to hyphens; a repeated heading gets `-1`, `-2`...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while seen.contains(&unique) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        seen.insert(unique);
    }
    seen
}

/// What is wrong with the relative links of the Markdown files under `root`.
fn broken_links(root: &Path) -> Vec<String> {
    let root = root.canonicalize().expect("root");
    let mut problems = vec![];
    for file in markdown_files(&root) {
        let text = std::fs::read_to_string(&file).expect("markdown");
        let name = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                file.clone()
            } else {
                match file
                    .parent()
                    .map(|d| d.join(path))
                    .map(|p| p.canonicalize())
                {
                    Some(Ok(p)) => p,
                    _ => {
                        problems.push(format!("{name}: ({link}) points to nothing"));
                        continue;
                    }
                }
            };
            if !target.starts_with(&root) {
                problems.push(format!("{name}: ({link}) points outside the repository"));
                continue;
            }
            if !anchor.is_empty() && target.extension().is_some_and(|e| e == "md") {
                let text = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&text).contains(anchor) {
                    problems.push(format!("{name}: ({link}) names no heading there"));
                }
            }
        }
    }
    problems
}

#[test]
fn every_relative_link_points_to_something_in_the_repository() {
    let problems = broken_links(&root());
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_link_check_finds_what_it_must() {
    let dir = std::env::temp_dir().join(format!("snm-docs-{}", std::process::id()));
    let repo = dir.join("repo");
    std::fs::create_dir_all(repo.join("docs/concepts")).expect("dirs");
    std::fs::write(dir.join("outside.md"), "# Outside\n").expect("outside");
    std::fs::write(
        repo.join("README.md"),
        "# Top\n\n[ok](docs/concepts/a.md#the-rules-in-short) [ok](#top) \
         [web](https://example.com/x) `[code](nowhere.md)`\n\
         [gone](docs/missing.md) [out](../outside.md) [anchor](docs/concepts/a.md#nope)\n\
         ```\n[fenced](nowhere.md)\n```\n",
    )
    .expect("readme");
    std::fs::write(
        repo.join("docs/concepts/a.md"),
        "# A\n\n## The rules, in short\n\n[up](../../README.md#top)\n",
    )
    .expect("a");
    let problems = broken_links(&repo);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains("docs/missing.md") && problems[0].contains("nothing"));
    assert!(problems[1].contains("outside the repository"));
    assert!(problems[2].contains("#nope") && problems[2].contains("no heading"));
}

#[test]
fn the_readme_is_read_in_five_minutes() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines: move the detail into docs/ and link it"
    );
}

/// The fenced code blocks of `text` that would swallow the page: a block
/// never closed, and a line of backticks followed by text (CommonMark: a
/// closing fence carries nothing after it, so inside a block such a line
/// closes nothing and everything after renders as code; opening one, the
/// text is prose stuck to a closing fence, not a language).
fn fence_problems(text: &str) -> Vec<String> {
    let mut problems = vec![];
    let mut open: Option<usize> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let trimmed = line.trim_start_matches(' ');
        if line.len() - trimmed.len() > 3 {
            continue; // indented: content, not a fence
        }
        let ticks = trimmed.chars().take_while(|c| *c == '`').count();
        if ticks < 3 {
            continue;
        }
        let rest = trimmed[ticks..].trim();
        match open {
            None if rest.contains(' ') => {
                problems.push(format!(
                    "line {n}: a fence followed by text ({rest:?}): a closing fence stands alone on its line"
                ));
                open = Some(n);
            }
            None => open = Some(n),
            Some(_) if rest.is_empty() => open = None,
            Some(start) => problems.push(format!(
                "line {n}: a fence followed by text inside the block opened at line {start}: it closes nothing"
            )),
        }
    }
    if let Some(start) = open {
        problems.push(format!(
            "the code block opened at line {start} is never closed"
        ));
    }
    problems
}

#[test]
fn every_code_block_is_closed_by_a_fence_of_its_own() {
    let mut problems = vec![];
    let files = markdown_files(&root());
    // README.md and the docs/ pages: a check of no file checks nothing.
    assert!(files.len() > 10, "{} Markdown files", files.len());
    for path in files {
        let text = std::fs::read_to_string(&path).expect("markdown");
        for p in fence_problems(&text) {
            problems.push(format!("{}: {p}", path.display()));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_fence_check_finds_what_it_must() {
    // The README's own mistake: text after the closing fence.
    let swallowed = "text\n```\ncode\n``` Events say\nmore text\n";
    let problems = fence_problems(swallowed);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("line 4"), "{problems:?}");
    assert!(
        problems[1].contains("opened at line 2 is never closed"),
        "{problems:?}"
    );
    assert_eq!(
        fence_problems("```sh\nls\n```\n\n    ``` indented\n"),
        Vec::<String>::new()
    );
}

/// What a CommonMark parser (GitHub's flavour is CommonMark) makes of
/// `text` that the author did not mean: a fenced block never closed (it
/// swallows the rest of the page), and a `## ` line outside every code
/// block that is not a heading.
fn render_problems(text: &str) -> Vec<String> {
    use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag};
    let line_of = |offset: usize| text[..offset].matches('\n').count() + 1;
    let mut problems = vec![];
    let mut headings = vec![];
    let mut blocks = vec![];
    for (event, range) in Parser::new(text).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { .. }) => headings.push(range),
            Event::Start(Tag::CodeBlock(kind)) => {
                let body = text[range.clone()].trim_end();
                let closed = match kind {
                    CodeBlockKind::Fenced(_) => body.ends_with("```") || body.ends_with("~~~"),
                    CodeBlockKind::Indented => true,
                };
                if !closed {
                    problems.push(format!(
                        "line {}: a code block never closed (it runs to the end of the page)",
                        line_of(range.start)
                    ));
                }
                blocks.push(range);
            }
            _ => {}
        }
    }
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let inside = |r: &std::ops::Range<usize>| r.contains(&offset);
        if line.starts_with("## ") && !headings.iter().any(inside) && !blocks.iter().any(inside) {
            problems.push(format!(
                "line {}: {:?} is not rendered as a heading",
                line_of(offset),
                line.trim_end()
            ));
        }
        offset += line.len();
    }
    problems
}

#[test]
fn every_page_renders_as_written() {
    let mut problems = vec![];
    let files = markdown_files(&root());
    assert!(files.len() > 10, "{} Markdown files", files.len());
    let mut headings = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).expect("markdown");
        headings += text.lines().filter(|l| l.starts_with("## ")).count();
        for p in render_problems(&text) {
            problems.push(format!("{}: {p}", path.display()));
        }
    }
    // The pages have sections: a check that saw none checked nothing.
    assert!(headings > 20, "{headings} `## ` lines");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_render_check_finds_what_it_must() {
    // Text after a closing fence leaves the block open: the next section
    // is swallowed, and is no heading.
    let swallowed = "# Page\n\n```sh\nls\n``` then text\n\n## Next\n\nmore\n";
    let problems = render_problems(swallowed);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("line 3: a code block never closed"),
        "{problems:?}"
    );
    // A heading is one; a `## ` line inside a closed code block is code.
    assert_eq!(
        render_problems("# Page\n\n## Fine\n\n```\n## in code\n```\n"),
        Vec::<String>::new()
    );
}
