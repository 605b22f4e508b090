// ags serve: the little the pages do in the browser. Everything works without it
// but live updates; it never builds HTML from message text (the server sends
// sanitised fragments), and the Content-Security-Policy allows no other script.
"use strict";

(function () {
  const UNITS = [["year", 31536000], ["month", 2592000], ["week", 604800],
                 ["day", 86400], ["hour", 3600], ["minute", 60]];
  const relative = new Intl.RelativeTimeFormat(undefined, { numeric: "auto" });

  function showTimes(root) {
    const now = Date.now();
    for (const el of root.querySelectorAll("time.ago[datetime]")) {
      const then = Date.parse(el.getAttribute("datetime"));
      if (Number.isNaN(then)) continue;
      const seconds = Math.round((then - now) / 1000);
      let text = "just now";
      for (const [unit, size] of UNITS) {
        if (Math.abs(seconds) >= size) {
          text = relative.format(Math.trunc(seconds / size), unit);
          break;
        }
      }
      el.title = el.getAttribute("datetime");
      el.textContent = text;
    }
  }

  // A link to a message inside a folded tool call unfolds it.
  function openTarget() {
    const id = decodeURIComponent(location.hash.slice(1));
    const el = id && document.getElementById(id);
    if (!el) return;
    for (let at = el.parentElement; at; at = at.parentElement) {
      if (at.tagName === "DETAILS") at.open = true;
    }
    el.classList.add("target");
    el.scrollIntoView({ block: "start" });
  }

  function openCalls(el) {
    return new Set([...el.querySelectorAll("details[open][data-call]")]
      .map((d) => d.getAttribute("data-call")));
  }

  function fromHtml(html) {
    const t = document.createElement("template");
    t.innerHTML = html;
    return t.content;
  }

  function live(entries) {
    const sid = entries.dataset.session;
    const badge = document.getElementById("live");
    const url = `/s/${sid}/events?since=${encodeURIComponent(entries.dataset.head)}`;
    const source = new EventSource(url);
    source.onopen = () => { if (badge) badge.hidden = false; };
    source.onerror = () => { if (badge) badge.hidden = true; };
    source.addEventListener("update", (ev) => {
      const data = JSON.parse(ev.data);
      const atBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
      for (const { id, html } of data.replace) {
        const old = document.getElementById(id);
        if (!old) continue;
        const keep = openCalls(old);
        const fresh = fromHtml(html);
        for (const d of fresh.querySelectorAll("details[data-call]")) {
          if (keep.has(d.getAttribute("data-call"))) d.open = true;
        }
        old.replaceWith(fresh);
      }
      for (const html of data.append) entries.append(fromHtml(html));
      showTimes(entries);
      entries.dataset.head = data.head || "";
      const count = document.getElementById("messages");
      if (count) count.textContent = String(data.messages);
      const title = document.getElementById("title");
      if (title) title.textContent = data.title || "(untitled)";
      const empty = document.getElementById("no-messages");
      if (empty && data.append.length) empty.remove();
      if (atBottom && data.append.length) window.scrollTo(0, document.body.scrollHeight);
    });
    source.addEventListener("reload", () => { source.close(); location.reload(); });
    source.addEventListener("gone", () => {
      source.close();
      if (badge) { badge.hidden = false; badge.textContent = "deleted"; }
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    showTimes(document);
    openTarget();
    window.addEventListener("hashchange", openTarget);
    const entries = document.getElementById("entries");
    if (entries && entries.dataset.session) live(entries);
  });
})();
