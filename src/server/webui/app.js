// wick's chat page: conversations kept in localStorage, each sent to
// /v1/chat/completions as a stream, as any client would send it. Model
// output is only ever inserted as text nodes (the Markdown renderer below
// builds elements itself), never as HTML.
"use strict";

const STORE = "wick.conversations";
const CURRENT = "wick.current";
const KEY = "wick.apiKey";

const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};

// ---- state ----------------------------------------------------------------

let conversations = load();
let current = localStorage.getItem(CURRENT);
let running = null; // {controller, conv, msg}
let modelName = null;

function load() {
  try {
    const list = JSON.parse(localStorage.getItem(STORE) || "[]");
    return Array.isArray(list) ? list.filter((c) => c && Array.isArray(c.messages)) : [];
  } catch (_) {
    return [];
  }
}

function save() {
  localStorage.setItem(STORE, JSON.stringify(conversations));
  if (current) localStorage.setItem(CURRENT, current);
}

function conv() {
  return conversations.find((c) => c.id === current) || null;
}

function newConversation() {
  const c = {
    id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8),
    title: "New chat",
    settings: {},
    messages: [],
  };
  conversations.unshift(c);
  current = c.id;
  save();
  return c;
}

// ---- Markdown ---------------------------------------------------------------
// Blocks: fenced code, headings, lists, quotes, tables, rules, paragraphs.
// Inline: code, bold, italics, strike-through, links (http, https, mailto).

function renderMarkdown(text, into) {
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)/);
    if (fence) {
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i++;
      into.appendChild(codeBlock(body.join("\n"), fence[2]));
      continue;
    }
    if (!line.trim()) { i++; continue; }
    const h = line.match(/^(#{1,6})\s+(.*)$/);
    if (h) {
      const e = el("h" + h[1].length);
      inline(h[2], e);
      into.appendChild(e);
      i++;
      continue;
    }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) { into.appendChild(el("hr")); i++; continue; }
    if (/^\s*>/.test(line)) {
      const body = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) body.push(lines[i++].replace(/^\s*> ?/, ""));
      const q = el("blockquote");
      renderMarkdown(body.join("\n"), q);
      into.appendChild(q);
      continue;
    }
    if (/^\s*\|.*\|\s*$/.test(line) && i + 1 < lines.length && /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/.test(lines[i + 1])) {
      const rows = [];
      rows.push(line);
      i += 2;
      while (i < lines.length && /^\s*\|.*\|\s*$/.test(lines[i])) rows.push(lines[i++]);
      into.appendChild(table(rows));
      continue;
    }
    const item = /^(\s*)([-*+]|\d{1,9}[.)])\s+/;
    if (item.test(line)) {
      const ordered = /\d/.test(line.match(item)[2]);
      const list = el(ordered ? "ol" : "ul");
      while (i < lines.length && (item.test(lines[i]) || (/^\s{2,}\S/.test(lines[i]) && list.lastChild))) {
        const m = lines[i].match(item);
        if (m && /\d/.test(m[2]) === ordered) {
          const li = el("li");
          inline(lines[i].slice(m[0].length), li);
          list.appendChild(li);
        } else if (m) {
          break;
        } else {
          list.lastChild.appendChild(document.createTextNode(" "));
          inline(lines[i].trim(), list.lastChild);
        }
        i++;
      }
      into.appendChild(list);
      continue;
    }
    const para = [];
    while (i < lines.length && lines[i].trim() && !/^(#{1,6}\s|\s*```|\s*~~~|\s*>|\s*([-*+]|\d{1,9}[.)])\s)/.test(lines[i])) {
      para.push(lines[i++]);
    }
    if (!para.length) para.push(lines[i++]);
    const p = el("p");
    para.forEach((l, k) => {
      if (k) p.appendChild(el("br"));
      inline(l, p);
    });
    into.appendChild(p);
  }
}

function codeBlock(code, lang) {
  const pre = el("pre");
  const c = el("code", null, code);
  if (lang) c.dataset.lang = lang;
  const copy = el("button", "copy", "Copy");
  copy.type = "button";
  copy.addEventListener("click", () => {
    navigator.clipboard.writeText(code).then(
      () => { copy.textContent = "Copied"; setTimeout(() => (copy.textContent = "Copy"), 1200); },
      () => { copy.textContent = "Copy failed"; },
    );
  });
  pre.append(copy, c);
  return pre;
}

function table(rows) {
  const cells = (r) => r.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((s) => s.trim());
  const t = el("table");
  const head = el("tr");
  cells(rows[0]).forEach((s) => { const th = el("th"); inline(s, th); head.appendChild(th); });
  const thead = el("thead");
  thead.appendChild(head);
  const tbody = el("tbody");
  rows.slice(1).forEach((r) => {
    const tr = el("tr");
    cells(r).forEach((s) => { const td = el("td"); inline(s, td); tr.appendChild(td); });
    tbody.appendChild(tr);
  });
  t.append(thead, tbody);
  return t;
}

// One pass over the text: the earliest match of any inline form wins.
const INLINE = [
  [/`([^`]+)`/, (m, into) => into.appendChild(el("code", null, m[1]))],
  [/\*\*(.+?)\*\*|__(.+?)__/, (m, into) => { const b = el("strong"); inline(m[1] || m[2], b); into.appendChild(b); }],
  [/~~(.+?)~~/, (m, into) => { const s = el("del"); inline(m[1], s); into.appendChild(s); }],
  [/\*([^*\s][^*]*?)\*|(?:^|(?<=\W))_([^_\s][^_]*?)_(?=\W|$)/, (m, into) => { const e = el("em"); inline(m[1] || m[2], e); into.appendChild(e); }],
  [/\[([^\]]+)\]\(([^)\s]+)\)/, (m, into) => into.appendChild(link(m[1], m[2]))],
  [/https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"]/, (m, into) => into.appendChild(link(m[0], m[0]))],
];

function inline(text, into) {
  while (text) {
    let best = null;
    for (const [re, make] of INLINE) {
      const m = text.match(re);
      if (m && (best === null || m.index < best.m.index)) best = { m, make };
    }
    if (!best) { into.appendChild(document.createTextNode(text)); return; }
    if (best.m.index) into.appendChild(document.createTextNode(text.slice(0, best.m.index)));
    best.make(best.m, into);
    text = text.slice(best.m.index + best.m[0].length);
  }
}

function link(label, href) {
  if (!/^(https?:|mailto:)/i.test(href)) return document.createTextNode(label);
  const a = el("a");
  a.href = href;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  inline(label, a);
  return a;
}

// ---- rendering --------------------------------------------------------------

function renderList() {
  const ul = $("conversations");
  ul.replaceChildren();
  for (const c of conversations) {
    const li = el("li", c.id === current ? "current" : "");
    li.dataset.id = c.id;
    const open = el("button", "open", c.title || "New chat");
    open.type = "button";
    open.title = c.title;
    open.addEventListener("click", () => { if (!running) { current = c.id; save(); renderAll(); closeSidebar(); } });
    const rename = el("button", "act rename", "\u270E");
    rename.type = "button";
    rename.title = "Rename";
    rename.setAttribute("aria-label", "Rename " + c.title);
    rename.addEventListener("click", () => startRename(li, c));
    const del = el("button", "act delete", "\u2715");
    del.type = "button";
    del.title = "Delete";
    del.setAttribute("aria-label", "Delete " + c.title);
    del.addEventListener("click", () => {
      if (running && running.conv === c) return;
      if (!confirm("Delete \u201C" + c.title + "\u201D?")) return;
      conversations = conversations.filter((x) => x !== c);
      if (current === c.id) current = conversations.length ? conversations[0].id : null;
      save();
      renderAll();
    });
    li.append(open, rename, del);
    ul.appendChild(li);
  }
}

function startRename(li, c) {
  const input = el("input");
  input.value = c.title;
  input.setAttribute("aria-label", "Conversation name");
  li.replaceChildren(input);
  input.focus();
  input.select();
  let done = false;
  const finish = (keep) => {
    if (done) return;
    done = true;
    if (keep && input.value.trim()) c.title = input.value.trim();
    save();
    renderList();
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") { e.preventDefault(); finish(true); }
    if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); finish(false); }
  });
  input.addEventListener("blur", () => finish(true));
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren();
  const c = conv();
  if (!c || !c.messages.length) {
    box.appendChild(el("p", "empty", modelName ? "Chat with " + modelName : "Start a conversation"));
    return;
  }
  c.messages.forEach((m, i) => box.appendChild(messageView(c, m, i)));
  box.scrollTop = box.scrollHeight;
}

function messageView(c, m, i) {
  const div = el("div", "msg " + m.role);
  div.dataset.index = i;
  const who = el("div", "who");
  who.appendChild(el("span", null, m.role === "user" ? "You" : "Assistant"));
  const last = i === c.messages.length - 1;
  if (!running) {
    if (m.role === "user") {
      const edit = el("button", "edit-turn", "Edit");
      edit.type = "button";
      edit.addEventListener("click", () => startEdit(div, c, i));
      who.appendChild(edit);
    } else if (last) {
      const again = el("button", "regenerate", "Regenerate");
      again.type = "button";
      again.addEventListener("click", () => { c.messages.pop(); save(); generate(c); });
      who.appendChild(again);
    }
  }
  div.appendChild(who);
  const body = el("div", "body");
  div.appendChild(body);
  fillBody(body, m);
  const stats = el("div", "stats");
  if (m.stats) stats.textContent = m.stats;
  div.appendChild(stats);
  if (m.error) div.appendChild(el("p", "error", m.error));
  return div;
}

function fillBody(body, m) {
  body.replaceChildren();
  if (m.role === "user") { body.textContent = m.content; return; }
  if (m.reasoning) {
    const d = el("details", "thinking");
    d.appendChild(el("summary", null, "Thinking"));
    d.appendChild(el("div", "text", m.reasoning));
    body.appendChild(d);
  }
  if (m.content) renderMarkdown(m.content, body);
  for (const t of m.tool_calls || []) {
    const box = el("div", "tool-call");
    box.appendChild(el("span", null, "Tool call: "));
    box.appendChild(el("span", "name", t.function.name));
    box.appendChild(el("pre", null, t.function.arguments));
    body.appendChild(box);
  }
}

function startEdit(div, c, i) {
  const body = div.querySelector(".body");
  const wrap = el("div", "edit");
  const ta = el("textarea");
  ta.value = c.messages[i].content;
  ta.rows = Math.min(12, ta.value.split("\n").length + 1);
  const buttons = el("div", "buttons");
  const ok = el("button", "save-edit", "Save and regenerate");
  ok.type = "button";
  const cancel = el("button", null, "Cancel");
  cancel.type = "button";
  buttons.append(ok, cancel);
  wrap.append(ta, buttons);
  body.replaceWith(wrap);
  ta.focus();
  ok.addEventListener("click", () => {
    if (!ta.value.trim()) return;
    c.messages = c.messages.slice(0, i);
    c.messages.push({ role: "user", content: ta.value });
    save();
    generate(c);
  });
  cancel.addEventListener("click", renderMessages);
}

function renderSettings() {
  const c = conv();
  const s = (c && c.settings) || {};
  $("set-system").value = s.system || "";
  $("set-temperature").value = s.temperature ?? "";
  $("set-top-p").value = s.top_p ?? "";
  $("set-max-tokens").value = s.max_tokens ?? "";
  $("set-seed").value = s.seed ?? "";
  $("set-extra").value = s.extra || "";
  $("settings-error").hidden = true;
}

function readSettings() {
  let c = conv();
  if (!c) c = newConversation();
  const num = (id) => {
    const v = $(id).value.trim();
    return v === "" ? undefined : Number(v);
  };
  c.settings = {
    system: $("set-system").value,
    temperature: num("set-temperature"),
    top_p: num("set-top-p"),
    max_tokens: num("set-max-tokens"),
    seed: num("set-seed"),
    extra: $("set-extra").value.trim(),
  };
  save();
}

function renderAll() {
  renderList();
  renderSettings();
  renderMessages();
  const busy = !!running;
  $("send").hidden = busy;
  $("stop").hidden = !busy;
}

// ---- talking to the server --------------------------------------------------

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem(KEY);
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

// What the page says for a refused request: the server's own message where
// it sent one.
async function failure(res) {
  let message = "";
  try {
    const body = await res.json();
    message = (body && body.error && (body.error.message || body.error)) || "";
  } catch (_) { /* not JSON */ }
  if (typeof message !== "string") message = JSON.stringify(message);
  switch (res.status) {
    case 400: return "The server refused the request: " + (message || "bad request");
    case 401: return "The API key was refused.";
    case 413: return "The conversation is too large for the server: " + message;
    case 429: return "The server is overloaded (429); try again shortly.";
    case 503: return "The server is loading the model or is overloaded (503); try again shortly." + (message ? " " + message : "");
    default: return "Error " + res.status + (message ? ": " + message : "");
  }
}

let keyWaiters = [];

function askKey(error) {
  $("key-dialog").hidden = false;
  $("key-error").hidden = !error;
  $("key-error").textContent = error || "";
  $("key-input").value = "";
  $("key-input").focus();
  return new Promise((resolve) => keyWaiters.push(resolve));
}

async function fetchModel() {
  for (;;) {
    let res;
    try {
      res = await fetch("/v1/models", { headers: headers() });
    } catch (_) {
      $("model").textContent = "cannot reach the server";
      return;
    }
    if (res.status === 401) {
      await askKey(sessionStorage.getItem(KEY) ? "That key was refused." : "");
      continue;
    }
    if (!res.ok) {
      $("model").textContent = await failure(res);
      setTimeout(fetchModel, 2000);
      return;
    }
    const body = await res.json();
    modelName = body.data && body.data[0] && body.data[0].id;
    $("model").textContent = modelName || "";
    if (!conv() || !conv().messages.length) renderMessages();
    return;
  }
}

function requestBody(c) {
  const s = c.settings || {};
  const messages = [];
  if (s.system && s.system.trim()) messages.push({ role: "system", content: s.system });
  for (const m of c.messages) {
    if (m.role === "user") messages.push({ role: "user", content: m.content });
    else if (m.role === "assistant" && !m.error) {
      const a = { role: "assistant", content: m.content || "" };
      if (m.tool_calls && m.tool_calls.length) a.tool_calls = m.tool_calls;
      messages.push(a);
    }
  }
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  if (modelName) body.model = modelName;
  for (const k of ["temperature", "top_p", "max_tokens", "seed"]) {
    if (s[k] !== undefined && s[k] !== null && !Number.isNaN(s[k])) body[k] = s[k];
  }
  if (s.extra) Object.assign(body, JSON.parse(s.extra));
  return body;
}

async function send(text) {
  if (!$("settings").hidden) readSettings();
  let c = conv();
  if (!c) c = newConversation();
  if (!c.messages.length) c.title = text.slice(0, 40) + (text.length > 40 ? "\u2026" : "");
  c.messages.push({ role: "user", content: text });
  save();
  await generate(c);
}

async function generate(c) {
  if (running) return;
  let body;
  try {
    body = requestBody(c);
  } catch (e) {
    $("settings").hidden = false;
    $("settings-error").hidden = false;
    $("settings-error").textContent = "More request fields: " + e.message;
    renderAll();
    return;
  }
  const msg = { role: "assistant", content: "" };
  c.messages.push(msg);
  const controller = new AbortController();
  running = { controller, conv: c, msg };
  renderAll();
  const view = $("messages").lastChild;
  view.classList.add("streaming");
  const bodyEl = view.querySelector(".body");
  const statsEl = view.querySelector(".stats");
  const start = performance.now();
  let first = null;
  let usage = null;
  let pending = false;
  const paint = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      fillBody(bodyEl, msg);
      const box = $("messages");
      if (box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
    });
  };
  try {
    for (;;) {
      const res = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: headers(),
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (res.status === 401) {
        await askKey(sessionStorage.getItem(KEY) ? "That key was refused." : "");
        continue;
      }
      if (!res.ok) { msg.error = await failure(res); break; }
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const event = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          for (const line of event.split("\n")) {
            if (!line.startsWith("data:")) continue;
            const data = line.slice(5).trim();
            if (data === "[DONE]") continue;
            const chunk = JSON.parse(data);
            if (chunk.error) { msg.error = "Error: " + (chunk.error.message || JSON.stringify(chunk.error)); continue; }
            if (chunk.usage) usage = chunk.usage;
            const choice = chunk.choices && chunk.choices[0];
            if (!choice || !choice.delta) continue;
            const d = choice.delta;
            if (d.content || d.reasoning_content || d.tool_calls) first = first ?? performance.now();
            if (d.content) msg.content += d.content;
            if (d.reasoning_content) msg.reasoning = (msg.reasoning || "") + d.reasoning_content;
            for (const t of d.tool_calls || []) {
              msg.tool_calls = msg.tool_calls || [];
              const at = t.index ?? msg.tool_calls.length;
              const slot = msg.tool_calls[at] || (msg.tool_calls[at] = { id: "", type: "function", function: { name: "", arguments: "" } });
              if (t.id) slot.id = t.id;
              if (t.function && t.function.name) slot.function.name += t.function.name;
              if (t.function && t.function.arguments) slot.function.arguments += t.function.arguments;
            }
            if (choice.finish_reason === "length") msg.stats = "cut off at the token limit";
            paint();
          }
        }
      }
      break;
    }
  } catch (e) {
    if (e.name === "AbortError") msg.stopped = true;
    else msg.error = "The request failed: " + e.message;
  }
  const end = performance.now();
  const parts = [];
  if (usage) parts.push(usage.completion_tokens + " tokens");
  if (first !== null) parts.push("first token " + ((first - start) / 1000).toFixed(2) + " s");
  if (usage && first !== null && end > first && usage.completion_tokens > 1) {
    parts.push(((usage.completion_tokens - 1) / ((end - first) / 1000)).toFixed(1) + " tok/s");
  }
  if (msg.stopped) parts.push("stopped");
  if (msg.stats && msg.stats.startsWith("cut off")) parts.push(msg.stats);
  msg.stats = parts.join(" \u00B7 ");
  running = null;
  save();
  renderAll();
  $("input").focus();
}

function stop() {
  if (running) running.controller.abort();
}

function closeSidebar() {
  $("app").classList.remove("side-open");
}

// ---- wiring -----------------------------------------------------------------

function init() {
  if (!conv()) current = conversations.length ? conversations[0].id : null;
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("input").value;
    if (!text.trim() || running) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && running) { e.preventDefault(); stop(); }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", () => {
    if (running) return;
    newConversation();
    renderAll();
    closeSidebar();
    $("input").focus();
  });
  $("toggle-settings").addEventListener("click", () => {
    const s = $("settings");
    s.hidden = !s.hidden;
    $("toggle-settings").setAttribute("aria-expanded", String(!s.hidden));
  });
  $("toggle-sidebar").addEventListener("click", () => $("app").classList.toggle("side-open"));
  for (const id of ["set-system", "set-temperature", "set-top-p", "set-max-tokens", "set-seed", "set-extra"]) {
    $(id).addEventListener("change", readSettings);
  }
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const key = $("key-input").value.trim();
    if (!key) return;
    sessionStorage.setItem(KEY, key);
    $("key-dialog").hidden = true;
    const waiting = keyWaiters;
    keyWaiters = [];
    waiting.forEach((resolve) => resolve());
  });
  renderAll();
  fetchModel();
  $("input").focus();
}

init();
