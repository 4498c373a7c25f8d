//! Reading an Atom (RFC 4287) or RSS (2.0, and 1.0's RDF form) feed (spec 14.3.7, 14.4):
//! [`parse_feed`], the one way a poller reads a feed, on quick-xml's pull parser.
//!
//! A feed is someone else's document, so every bound is explicit and a refusal is a typed
//! [`FeedError`] with a fixed phrase: a DOCTYPE (which is where entity declarations live,
//! so "billion laughs" never starts) or any entity reference other than XML's five and
//! character references; more than [`FEED_BYTES_MAX`] of text; elements nested deeper than
//! [`FEED_DEPTH_MAX`]; more than [`FEED_ENTRIES_MAX`] entries. Each kept field is cut at
//! [`FEED_FIELD_BYTES_MAX`]. Memory is linear in the input, which is bounded, and time in
//! the number of XML events, which the input bounds as well.
//!
//! Must not: fetch anything, expand an entity, or put the feed's text into an error.

use std::fmt;

use quick_xml::events::{BytesRef, Event};

/// The most feed text parsed.
pub const FEED_BYTES_MAX: usize = 8 * 1024 * 1024;
/// The deepest element nesting accepted (a feed needs 4 or 5; XHTML content a few more).
pub const FEED_DEPTH_MAX: usize = 32;
/// The most entries a feed may hold.
pub const FEED_ENTRIES_MAX: usize = 1_000;
/// Each kept text field is cut at this many bytes (on a character boundary).
pub const FEED_FIELD_BYTES_MAX: usize = 16 * 1024;

/// Which format the document is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedFormat {
    Atom,
    /// RSS 2.0 (`<rss><channel><item>`) or RSS 1.0 (`<rdf:RDF><item>`).
    Rss,
}

/// A feed as dicts: its title and entries in document order.
#[derive(Debug, Clone, PartialEq)]
pub struct Feed {
    pub format: FeedFormat,
    pub title: String,
    pub entries: Vec<FeedEntry>,
}

/// One entry (Atom `entry`, RSS `item`); absent fields are empty.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FeedEntry {
    /// Atom `id`, RSS `guid` (or RSS 1.0's `rdf:about`).
    pub id: String,
    pub title: String,
    /// Atom `link` `href` (the `alternate` one first), RSS `link`.
    pub link: String,
    /// Atom `published`, RSS `pubDate`.
    pub published: String,
    /// Atom `updated`, Dublin Core `date`.
    pub updated: String,
    /// Atom `summary` (else `content`), RSS `description`.
    pub summary: String,
}

/// Why a feed was refused. Each is a fixed phrase, never the feed's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeedError {
    #[error("feed larger than {FEED_BYTES_MAX} bytes")]
    TooLarge,
    #[error("feed has a DOCTYPE (entity declarations are refused)")]
    DocType,
    #[error("feed uses an entity reference other than XML's own")]
    Entity,
    #[error("feed nests elements deeper than {FEED_DEPTH_MAX}")]
    TooDeep,
    #[error("feed has more than {FEED_ENTRIES_MAX} entries")]
    TooManyEntries,
    #[error("feed is not well-formed XML")]
    NotXml,
    #[error("document is neither an Atom nor an RSS feed")]
    NotAFeed,
}

/// The field of an entry an element's text goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Id,
    Title,
    Link,
    Published,
    Updated,
    Summary,
    /// Atom `content`: the summary when there is no `summary`.
    Content,
}

impl Field {
    fn of(format: FeedFormat, local: &str) -> Option<Field> {
        match (format, local) {
            (FeedFormat::Atom, "id") | (FeedFormat::Rss, "guid") => Some(Field::Id),
            (_, "title") => Some(Field::Title),
            (FeedFormat::Rss, "link") => Some(Field::Link),
            (FeedFormat::Atom, "published") | (FeedFormat::Rss, "pubDate") => {
                Some(Field::Published)
            }
            (FeedFormat::Atom, "updated") | (_, "date") => Some(Field::Updated),
            (FeedFormat::Atom, "summary") | (FeedFormat::Rss, "description") => {
                Some(Field::Summary)
            }
            (FeedFormat::Atom, "content") => Some(Field::Content),
            _ => None,
        }
    }
}

/// Parser state: the open elements' local names, the entry being read, and where text goes.
struct Reading {
    format: Option<FeedFormat>,
    stack: Vec<String>,
    title: String,
    entries: Vec<FeedEntry>,
    entry: Option<(usize, FeedEntry, String)>,
    /// The field collecting text, and the depth of its element.
    field: Option<(Field, usize)>,
    /// Collecting the feed's own title (the depth of its element).
    feed_title: Option<usize>,
}

/// Parses a feed (see the module docs for what is refused).
pub fn parse_feed(text: &str) -> Result<Feed, FeedError> {
    if text.len() > FEED_BYTES_MAX {
        return Err(FeedError::TooLarge);
    }
    let mut reader = quick_xml::Reader::from_str(text);
    reader.config_mut().check_end_names = true;
    let mut r = Reading {
        format: None,
        stack: Vec::new(),
        title: String::new(),
        entries: Vec::new(),
        entry: None,
        field: None,
        feed_title: None,
    };
    loop {
        match reader.read_event().map_err(|_| FeedError::NotXml)? {
            Event::DocType(_) => return Err(FeedError::DocType),
            Event::Start(e) => {
                let local = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
                let about = attribute(&e, b"about")?;
                r.open(local, about)?;
                r.atom_link(&e)?;
            }
            Event::Empty(e) => {
                let local = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
                r.open(local, None)?;
                r.atom_link(&e)?;
                r.close();
            }
            Event::End(_) => r.close(),
            Event::Text(t) => {
                let s = t.xml_content().map_err(|_| FeedError::NotXml)?;
                r.text(&s);
            }
            Event::CData(c) => {
                let s = c.decode().map_err(|_| FeedError::NotXml)?;
                r.text(&s);
            }
            Event::GeneralRef(g) => {
                let s = resolve_ref(&g)?;
                r.text(&s);
            }
            Event::Decl(_) | Event::PI(_) | Event::Comment(_) => {}
            Event::Eof => break,
        }
    }
    let format = r.format.ok_or(FeedError::NotAFeed)?;
    Ok(Feed {
        format,
        title: r.title.trim().to_string(),
        entries: r.entries,
    })
}

/// XML's five entities and character references; anything else was declared in a DTD,
/// which is refused.
fn resolve_ref(g: &BytesRef<'_>) -> Result<String, FeedError> {
    if g.is_char_ref() {
        return match g.resolve_char_ref() {
            Ok(Some(c)) => Ok(c.to_string()),
            _ => Err(FeedError::NotXml),
        };
    }
    let name = g.decode().map_err(|_| FeedError::NotXml)?;
    quick_xml::escape::resolve_xml_entity(&name)
        .map(str::to_string)
        .ok_or(FeedError::Entity)
}

/// An attribute's unescaped value by local name.
fn attribute(
    e: &quick_xml::events::BytesStart<'_>,
    local: &[u8],
) -> Result<Option<String>, FeedError> {
    for a in e.attributes() {
        let a = a.map_err(|_| FeedError::NotXml)?;
        if a.key.local_name().as_ref() == local {
            let v = a.unescape_value().map_err(|_| FeedError::Entity)?;
            return Ok(Some(v.into_owned()));
        }
    }
    Ok(None)
}

impl Reading {
    fn depth(&self) -> usize {
        self.stack.len()
    }

    fn open(&mut self, local: String, about: Option<String>) -> Result<(), FeedError> {
        if self.depth() >= FEED_DEPTH_MAX {
            return Err(FeedError::TooDeep);
        }
        let depth = self.depth() + 1;
        if depth == 1 {
            self.format = match local.as_str() {
                "feed" => Some(FeedFormat::Atom),
                "rss" | "RDF" => Some(FeedFormat::Rss),
                _ => return Err(FeedError::NotAFeed),
            };
        }
        let format = self.format.ok_or(FeedError::NotAFeed)?;
        let parent = self.stack.last().map(String::as_str).unwrap_or("");
        let is_entry = match format {
            FeedFormat::Atom => local == "entry" && depth == 2,
            FeedFormat::Rss => local == "item" && matches!(parent, "channel" | "RDF"),
        };
        if is_entry && self.entry.is_none() {
            if self.entries.len() >= FEED_ENTRIES_MAX {
                return Err(FeedError::TooManyEntries);
            }
            let entry = FeedEntry {
                id: about.unwrap_or_default(),
                ..Default::default()
            };
            self.entry = Some((depth, entry, String::new()));
        } else if let Some((entry_depth, ..)) = &self.entry {
            if depth == entry_depth + 1 && self.field.is_none() {
                self.field = Field::of(format, &local).map(|f| (f, depth));
            }
        } else if local == "title"
            && self.feed_title.is_none()
            && matches!(parent, "feed" | "channel")
        {
            self.feed_title = Some(depth);
        }
        self.stack.push(local);
        Ok(())
    }

    /// Atom's `<link href="..."/>`: the `alternate` (or unlabelled) link of an entry.
    fn atom_link(&mut self, e: &quick_xml::events::BytesStart<'_>) -> Result<(), FeedError> {
        if self.format != Some(FeedFormat::Atom) || e.local_name().as_ref() != b"link" {
            return Ok(());
        }
        let Some((entry_depth, entry, _)) = &mut self.entry else {
            return Ok(());
        };
        if self.stack.len() != *entry_depth + 1 {
            return Ok(());
        }
        let rel = attribute(e, b"rel")?;
        let alternate = rel.as_deref().is_none_or(|r| r == "alternate");
        // The alternate link wins; another kind fills in only while there is none.
        if let Some(href) = attribute(e, b"href")?
            && (alternate || entry.link.is_empty())
        {
            entry.link = cut(&href);
        }
        Ok(())
    }

    fn close(&mut self) {
        let depth = self.depth();
        if self.field.is_some_and(|(_, d)| d == depth) {
            self.field = None;
        }
        if self.feed_title == Some(depth) {
            self.feed_title = Some(usize::MAX);
        }
        if self.entry.as_ref().is_some_and(|(d, ..)| *d == depth)
            && let Some((_, mut entry, content)) = self.entry.take()
        {
            if entry.summary.is_empty() {
                entry.summary = content;
            }
            trim_all(&mut entry);
            self.entries.push(entry);
        }
        self.stack.pop();
    }

    fn text(&mut self, s: &str) {
        if let Some(d) = self.feed_title
            && d == self.depth()
        {
            push_capped(&mut self.title, s);
            return;
        }
        let Some((field, _)) = self.field else { return };
        let Some((_, entry, content)) = &mut self.entry else {
            return;
        };
        let target = match field {
            Field::Id => &mut entry.id,
            Field::Title => &mut entry.title,
            Field::Link => &mut entry.link,
            Field::Published => &mut entry.published,
            Field::Updated => &mut entry.updated,
            Field::Summary => &mut entry.summary,
            Field::Content => content,
        };
        push_capped(target, s);
    }
}

fn trim_all(e: &mut FeedEntry) {
    for f in [
        &mut e.id,
        &mut e.title,
        &mut e.link,
        &mut e.published,
        &mut e.updated,
        &mut e.summary,
    ] {
        let t = f.trim();
        if t.len() != f.len() {
            *f = t.to_string();
        }
    }
}

/// Appends `s`, keeping the field within [`FEED_FIELD_BYTES_MAX`] on a character boundary.
fn push_capped(field: &mut String, s: &str) {
    let room = FEED_FIELD_BYTES_MAX.saturating_sub(field.len());
    if room == 0 {
        return;
    }
    let mut end = s.len().min(room);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    field.push_str(&s[..end]);
}

fn cut(s: &str) -> String {
    let mut out = String::new();
    push_capped(&mut out, s);
    out
}

impl fmt::Display for FeedFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FeedFormat::Atom => "atom",
            FeedFormat::Rss => "rss",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ATOM: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom">
  <title>Example Feed</title>
  <link href="http://example.org/"/>
  <updated>2003-12-13T18:30:02Z</updated>
  <id>urn:uuid:60a76c80-d399-11d9-b93C-0003939e0af6</id>
  <entry>
    <title>Atom-Powered Robots Run Amok &amp; more</title>
    <link rel="self" href="http://example.org/self"/>
    <link href="http://example.org/2003/12/13/atom03"/>
    <id>urn:uuid:1225c695-cfb8-4ebb-aaaa-80da344efa6a</id>
    <updated>2003-12-13T18:30:02Z</updated>
    <summary>Some text &#233;.</summary>
  </entry>
</feed>"#;

    const RSS: &str = r#"<?xml version="1.0"?>
<rss version="2.0"><channel><title>Liftoff News</title><link>http://liftoff.msfc.nasa.gov/</link>
<item><title>Star City</title><link>http://liftoff.msfc.nasa.gov/news/2003/news-starcity.asp</link>
<description><![CDATA[How do <b>Americans</b> get ready?]]></description>
<pubDate>Tue, 03 Jun 2003 09:39:21 GMT</pubDate>
<guid>http://liftoff.msfc.nasa.gov/2003/06/03.html#item573</guid></item>
<item><title>Second</title><guid isPermaLink="false">x-2</guid></item>
</channel></rss>"#;

    #[test]
    fn feeds_parse_atom_with_alternate_link_and_xml_entities() {
        let f = parse_feed(ATOM).unwrap();
        assert_eq!(
            (f.format, f.title.as_str()),
            (FeedFormat::Atom, "Example Feed")
        );
        assert_eq!(f.entries.len(), 1);
        let e = &f.entries[0];
        assert_eq!(e.title, "Atom-Powered Robots Run Amok & more");
        assert_eq!(e.link, "http://example.org/2003/12/13/atom03");
        assert_eq!(e.id, "urn:uuid:1225c695-cfb8-4ebb-aaaa-80da344efa6a");
        assert_eq!(e.summary, "Some text \u{e9}.");
        assert_eq!(e.updated, "2003-12-13T18:30:02Z");
    }

    #[test]
    fn feeds_parse_rss_items_with_cdata() {
        let f = parse_feed(RSS).unwrap();
        assert_eq!(
            (f.format, f.title.as_str()),
            (FeedFormat::Rss, "Liftoff News")
        );
        assert_eq!(f.entries.len(), 2);
        assert_eq!(f.entries[0].summary, "How do <b>Americans</b> get ready?");
        assert_eq!(f.entries[0].published, "Tue, 03 Jun 2003 09:39:21 GMT");
        assert_eq!(f.entries[1].id, "x-2");
    }

    #[test]
    fn feeds_refuse_a_doctype_and_entity_expansion() {
        let bomb = r#"<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>
<rss><channel><item><title>&lol2;</title></item></channel></rss>"#;
        assert_eq!(parse_feed(bomb), Err(FeedError::DocType));
        // An undeclared entity without a DOCTYPE is refused too, never expanded.
        let undeclared = "<rss><channel><item><title>&lol;</title></item></channel></rss>";
        assert_eq!(parse_feed(undeclared), Err(FeedError::Entity));
        let external = "<!DOCTYPE rss SYSTEM \"file:///etc/passwd\"><rss/>";
        assert_eq!(parse_feed(external), Err(FeedError::DocType));
    }

    #[test]
    fn feeds_refuse_deep_nesting_too_many_entries_and_too_much_text() {
        let deep = format!("<feed>{}", "<a>".repeat(100_000));
        assert_eq!(parse_feed(&deep), Err(FeedError::TooDeep));
        let many = format!(
            "<rss><channel>{}</channel></rss>",
            "<item><title>t</title></item>".repeat(FEED_ENTRIES_MAX + 1)
        );
        assert_eq!(parse_feed(&many), Err(FeedError::TooManyEntries));
        let big = format!(
            "<rss><channel>{}</channel></rss>",
            " ".repeat(FEED_BYTES_MAX)
        );
        assert_eq!(parse_feed(&big), Err(FeedError::TooLarge));
    }

    #[test]
    fn feeds_refuse_what_is_not_a_feed_and_cut_long_fields() {
        assert_eq!(parse_feed("<html><body/></html>"), Err(FeedError::NotAFeed));
        assert_eq!(parse_feed("<rss><channel></rss>"), Err(FeedError::NotXml));
        assert_eq!(parse_feed("not xml at all"), Err(FeedError::NotAFeed));
        let long = format!(
            "<rss><channel><item><title>{}</title></item></channel></rss>",
            "\u{e9}".repeat(FEED_FIELD_BYTES_MAX)
        );
        let f = parse_feed(&long).unwrap();
        assert!(f.entries[0].title.len() <= FEED_FIELD_BYTES_MAX);
        assert!(f.entries[0].title.len() > FEED_FIELD_BYTES_MAX - 4);
    }
}
