//! The console's layout and labels. Pages are maud templates: every interpolated value is
//! escaped by its type, so task text full of markup and script shows as text; only `Markup`
//! (a template's own output) goes in unescaped.

use maud::{DOCTYPE, Markup, html};

/// A value as one URL path segment (T9): everything but `A-Z a-z 0-9 - . _ ~` percent-encoded,
/// so a name with `/ ? #` stays one segment of its own link.
pub fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    Ja,
    En,
}

/// The browser's first preferred language that we speak; English otherwise.
pub fn lang(accept_language: Option<&str>) -> Lang {
    let first = accept_language
        .unwrap_or_default()
        .split(',')
        .map(|t| t.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
        .find(|t| t.starts_with("ja") || t.starts_with("en"));
    if first.is_some_and(|t| t.starts_with("ja")) { Lang::Ja } else { Lang::En }
}

/// A label in the page's language.
pub fn t(lang: Lang, en: &'static str, ja: &'static str) -> &'static str {
    match lang {
        Lang::Ja => ja,
        Lang::En => en,
    }
}

/// A whole page: navigation (with the logout form and its CSRF token) when signed in, and `body`.
pub fn page(lang: Lang, title: &str, csrf: Option<&str>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang=(if lang == Lang::Ja { "ja" } else { "en" }) {
            head {
                meta charset="utf-8";
                title { (title) " — pcmail" }
                meta name="viewport" content="width=device-width, initial-scale=1";
                link rel="stylesheet" href="/ui/style.css";
                @if csrf.is_some() { script src="/ui/live.js" defer {} }
            }
            body {
                @if let Some(csrf) = csrf {
                    nav {
                        a href="/ui/overview" { (t(lang, "Overview", "概要")) } " "
                        a href="/ui/ledger" { (t(lang, "Ledger", "台帳")) } " "
                        a href="/ui/mail" { (t(lang, "Mail", "メール")) } " "
                        a href="/ui/alerts" { (t(lang, "Alerts", "アラート")) } " "
                        a href="/ui/jobs" { (t(lang, "Jobs", "ジョブ")) } " "
                        a href="/ui/specs" { (t(lang, "Specs", "設定")) } " "
                        form.inline.search method="get" action="/ui/search" role="search" {
                            input #search-q type="search" name="q" aria-label=(t(lang, "Search mail and ledger", "メールと台帳を検索"))
                                placeholder=(t(lang, "Search mail and ledger", "メールと台帳を検索"));
                        }
                        form.inline method="post" action="/ui/logout" {
                            input type="hidden" name="csrf" value=(csrf);
                            button { (t(lang, "Log out", "ログアウト")) }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// Columns past which a table is a stack of cards on a phone (X6): each row one card, each
/// cell led by its column's name (`data-label`); a narrower table stays a table.
const CARDS_PAST: usize = 3;

/// A table with a header row, in a box of its own that scrolls sideways if it must, so the
/// page never does (X6); wide ones are stacked cards on a narrow screen.
pub fn table(headers: &[&str], rows: impl IntoIterator<Item = Vec<Markup>>) -> Markup {
    html! {
        div.table {
            table.cards[headers.len() > CARDS_PAST] {
                thead { tr { @for h in headers { th scope="col" { (h) } } } }
                tbody {
                    @for row in rows {
                        tr { @for (i, cell) in row.into_iter().enumerate() { td data-label=(headers.get(i).copied().unwrap_or_default()) { (cell) } } }
                    }
                }
            }
        }
    }
}

/// Swaps in the parts of a page marked `data-live` as they change, served at `/ui/live.js`
/// (the CSP allows no inline script).
pub const LIVE_JS: &str = include_str!("live.js");

/// The stylesheet, served at `/ui/style.css`: the pages' CSP allows no inline style (T9). On a
/// narrow screen (X6) the navigation wraps, long words break anywhere rather than widen the page,
/// and wide tables become cards; colours keep WCAG AA contrast.
pub const CSS: &str = "body{font-family:system-ui,sans-serif;margin:0;color:#222;line-height:1.4}\
nav{background:#1f3a5f;padding:.5em 1em;display:flex;flex-wrap:wrap;align-items:center;gap:.4em 1em}\
nav a{color:#fff;padding:.2em 0}nav form.inline{display:inline;margin:0}nav form.search{margin-left:auto}\
main{padding:1em}h1{font-size:1.6em;margin:.3em 0}h1,h2,td,p,pre,figcaption{overflow-wrap:anywhere}table:not(.cards) th{word-break:keep-all}table:not(.cards) td:first-child{overflow-wrap:break-word;word-break:keep-all}\
div.table{overflow-x:auto;max-width:100%}\
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #ddd;padding:.3em .5em;text-align:left;vertical-align:top}\
.review{background:#fff6d6}.overdue{color:#b00020;font-weight:bold}.error{color:#b00020}pre{white-space:pre-wrap;margin:0}\
label{display:block;margin:.5em 0}textarea{width:100%;min-height:5em;box-sizing:border-box}label.inline,form.inline{display:inline;margin-right:1em}\
button,select,input,textarea{font:inherit}button,select{min-height:2.2em}\
#filter{display:flex;flex-wrap:wrap;align-items:center;gap:.4em 1em}#filter label.inline{margin:0}.pager a{margin-right:1em}.columns{display:flex;gap:2em;flex-wrap:wrap}.columns section{flex:1;min-width:14em}.columns section.wide{flex:2 1 20em}\
nav input[type=search]{width:16em;max-width:100%;box-sizing:border-box}#search-text{max-width:100%;box-sizing:border-box}\
figure.chart{margin:1em 0}figure.chart svg{width:100%;max-width:600px;height:auto;border:1px solid #eee}\
.visually-hidden{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap}\
@media (max-width:40em){main{padding:.75em}nav{padding:.5em .75em}nav form.search{margin-left:0;flex:1 1 12em}\
nav input[type=search]{width:100%}.columns{gap:0 1em}.columns section{min-width:10em}.columns section.wide{flex-basis:100%}\
table.cards thead{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap}\
table.cards,table.cards tbody,table.cards tr,table.cards td{display:block;width:auto}\
table.cards tr{border:1px solid #ccc;border-radius:4px;margin:.5em 0;padding:.3em .6em}\
table.cards td{border:0;padding:.15em 0}table.cards td::before{content:attr(data-label) \": \";font-weight:bold;color:#444}}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_text_full_of_markup_and_script_is_shown_escaped() {
        let hostile = "<script>alert('x')</script><img src=x onerror=\"steal()\">&amp;";
        let cell = html! { (hostile) };
        let whole = page(Lang::En, hostile, Some("\"><script>"), table(&[hostile], [vec![cell]])).into_string();
        assert!(!whole.contains("<script>"), "{whole}");
        assert!(!whole.contains("<img"), "{whole}");
        assert!(
            whole.contains(
                "&lt;script&gt;alert('x')&lt;/script&gt;&lt;img src=x onerror=&quot;steal()&quot;&gt;&amp;amp;"
            ),
            "{whole}"
        );
        assert!(
            whole.contains("value=\"&quot;&gt;&lt;script&gt;\""),
            "the CSRF token stays inside its attribute: {whole}"
        );
    }

    #[test]
    fn console_labels_follow_the_browsers_language() {
        assert_eq!(lang(Some("ja,en-US;q=0.9")), Lang::Ja);
        assert_eq!(lang(Some("en-GB,ja;q=0.5")), Lang::En);
        assert_eq!(lang(Some("fr-FR,ja;q=0.8")), Lang::Ja);
        assert_eq!(lang(None), Lang::En);
        assert_eq!(t(Lang::Ja, "Ledger", "台帳"), "台帳");
    }
}
