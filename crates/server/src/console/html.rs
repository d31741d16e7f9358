//! The console's HTML: one escape function every interpolation goes through, the page layout,
//! and the labels in Japanese and English.

/// Text as HTML: `& < > " '` escaped, so task text full of markup and script shows as text.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

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

/// A whole page: navigation (with the logout form and its CSRF token) and `body`.
pub fn page(lang: Lang, title: &str, csrf: Option<&str>, body: &str) -> String {
    let nav = match csrf {
        Some(csrf) => format!(
            "<nav><a href=\"/ui/ledger\">{}</a> <a href=\"/ui/mail\">{}</a> <a href=\"/ui/alerts\">{}</a> \
             <a href=\"/ui/jobs\">{}</a> <a href=\"/ui/specs\">{}</a> \
             <form method=\"post\" action=\"/ui/logout\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <button>{}</button></form></nav>",
            t(lang, "Ledger", "台帳"),
            t(lang, "Mail", "メール"),
            t(lang, "Alerts", "アラート"),
            t(lang, "Jobs", "ジョブ"),
            t(lang, "Specs", "設定"),
            esc(csrf),
            t(lang, "Log out", "ログアウト"),
        ),
        None => String::new(),
    };
    let html_lang = if lang == Lang::Ja { "ja" } else { "en" };
    format!(
        "<!doctype html><html lang=\"{html_lang}\"><head><meta charset=\"utf-8\"><title>{} — pcmail</title>\
         <meta name=\"viewport\" content=\"width=device-width\"><link rel=\"stylesheet\" href=\"/ui/style.css\"></head>\
         <body>{nav}<main><h1>{}</h1>{body}</main></body></html>",
        esc(title),
        esc(title)
    )
}

/// The stylesheet, served at `/ui/style.css`: the pages' CSP allows no inline style (T9).
pub const CSS: &str = "body{font-family:system-ui,sans-serif;margin:0;color:#222}nav{background:#1f3a5f;padding:.5em 1em}\
nav a{color:#fff;margin-right:1em}nav form.inline{display:inline;float:right}main{padding:1em}\
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #ddd;padding:.3em .5em;text-align:left;vertical-align:top}\
.review{background:#fff6d6}.overdue{color:#b00020;font-weight:bold}.error{color:#b00020}pre{white-space:pre-wrap}\
label{display:block;margin:.5em 0}textarea{width:100%;min-height:5em}";

/// A table with a header row; cells are already HTML.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let head: String = headers.iter().map(|h| format!("<th>{}</th>", esc(h))).collect();
    let body: String = rows
        .iter()
        .map(|r| format!("<tr>{}</tr>", r.iter().map(|c| format!("<td>{c}</td>")).collect::<String>()))
        .collect();
    format!("<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_text_full_of_markup_and_script_is_shown_escaped() {
        let hostile = "<script>alert('x')</script><img src=x onerror=\"steal()\">&amp;";
        let shown = esc(hostile);
        assert!(!shown.contains('<') && !shown.contains('>') && !shown.contains('"'), "{shown}");
        assert_eq!(
            shown,
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&lt;img src=x onerror=&quot;steal()&quot;&gt;&amp;amp;"
        );
        let whole = page(Lang::En, hostile, Some("\"><script>"), "");
        assert!(!whole.contains("<script>alert"), "{whole}");
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
