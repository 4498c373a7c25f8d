// hookspool's dashboard: live updates and confirmed actions, no framework and no build step.
// The live stream (/api/v1/events/stream) says something happened; the page then fetches
// itself again (at most every 3 s) and swaps its <main>, so what is shown is always what
// the server rendered.
// Actions POST with the page's CSRF token after a confirm() dialog.
"use strict";
(function () {
  const csrf = document.querySelector('meta[name="hookspool-csrf"]');
  const token = csrf ? csrf.content : "";
  // At most one re-render every REFRESH_MIN_MS while events keep coming: readable for a
  // person, and a page left open costs the spool a read every few seconds, not per event.
  const REFRESH_MIN_MS = 3000;
  let pending = null;
  let last = 0;

  function refresh() {
    pending = null;
    last = Date.now();
    fetch(location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
      .then((html) => {
        const doc = new DOMParser().parseFromString(html, "text/html");
        const next = doc.getElementById("live");
        const main = document.getElementById("live");
        if (!next || !main) return;
        const before = new Set(Array.from(main.querySelectorAll("tr[data-batch]"), (r) => r.dataset.batch));
        const checked = new Set(Array.from(main.querySelectorAll("input[name=batch]:checked"), (i) => i.value));
        main.innerHTML = next.innerHTML;
        main.querySelectorAll("tr[data-batch]").forEach((r) => {
          if (!before.has(r.dataset.batch)) r.classList.add("fresh");
        });
        main.querySelectorAll("input[name=batch]").forEach((i) => {
          if (checked.has(i.value)) i.checked = true;
        });
        bind();
      })
      .catch(() => {});
  }

  function soon() {
    if (pending === null) pending = setTimeout(refresh, Math.max(700, last + REFRESH_MIN_MS - Date.now()));
  }

  function post(url, body) {
    return fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Hookspool-CSRF": token },
      body: JSON.stringify(body || {}),
    }).then((r) => r.json().then((j) => ({ ok: r.ok, json: j })));
  }

  function say(id, text) {
    const el = document.getElementById(id);
    if (el) el.textContent = text;
  }

  function bind() {
    document.querySelectorAll("button[data-post]").forEach((b) => {
      b.onclick = () => {
        if (!confirm(b.dataset.confirm || "Are you sure?")) return;
        b.disabled = true;
        post(b.dataset.post).then((r) => {
          say("action-result", r.ok ? "done" : r.json.message || "refused");
          refresh();
        });
      };
    });
    const sel = document.getElementById("replay-selected");
    if (sel) {
      sel.onclick = () => {
        const ids = Array.from(document.querySelectorAll("input[name=batch]:checked"), (i) => Number(i.value));
        if (ids.length === 0) { say("replay-result", "select dead batches first"); return; }
        if (!confirm((sel.dataset.confirm || "Replay?") + " (" + ids.length + ")")) return;
        post("/api/v1/replay", { batches: ids }).then((r) => {
          say("replay-result", r.ok ? "replayed " + ids.length : r.json.message || "refused");
          refresh();
        });
      };
    }
  }

  bind();
  if (window.EventSource) {
    const dot = document.getElementById("live-dot");
    const es = new EventSource("/api/v1/events/stream");
    es.onopen = () => dot && dot.classList.add("on");
    es.onerror = () => dot && dot.classList.remove("on");
    es.onmessage = soon;
  }
})();
