// attnkit head view. Data: see attnkit.viz.head_view._encode (sparse rows, uint8 weights).
// Defines the one global name, window.attnkitViz.headView(root): it draws the view whose
// elements sit inside `root` (the page's <body>, or one notebook output's <div>). Every
// element is found through `root` by class, never by id, and all state lives in the call,
// so several views on one notebook page never touch each other.
(function (global) {
  "use strict";
  const ns = global.attnkitViz || (global.attnkitViz = {});
  ns.headView = function mount(root) {
    if (!root || root.dataset.ready === "1") return; // a re-run script must not draw twice
    const el = (name) => root.querySelector(".ak-" + name);
    // The standalone page names its data #ak-data (a stable hook for tools reading pages).
    const D = JSON.parse(root.querySelector(".ak-data, #ak-data").textContent);
    const [L, H] = D.shape;
    const N = D.tokens.length;
    const S = D.keyTokens.length;
    const M = H + 1; // "heads" per layer: H heads, then the mean of heads
    const ROW = 22;
    const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
                     "#e377c2", "#8c564b", "#bcbd22", "#7f7f7f", "#393b79", "#637939"];
    const MEAN_COLOR = "#24292f";
    // Interface words (head_view(lang=...)); pages made before lang existed carry none.
    const UI = Object.assign({ mean: "mean of heads", headN: "head {h}", query: "query",
                               key: "key", lines: "lines" }, D.ui || {});
    const headName = (h) => UI.headN.replace("{h}", String(h));

    function bytes(b64) {
      const s = atob(b64);
      const out = new Uint8Array(s.length);
      for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
      return out;
    }
    const counts = bytes(D.counts);
    const kb = bytes(D.keys);
    const wts = bytes(D.weights);
    const keys = new Uint16Array(wts.length);
    for (let i = 0; i < keys.length; i++) keys[i] = kb[2 * i] | (kb[2 * i + 1] << 8);
    // rowStart[(l * M + h) * N + i] = first entry of row i of matrix (l, h).
    const rowStart = new Uint32Array(counts.length + 1);
    for (let r = 0; r < counts.length; r++) rowStart[r + 1] = rowStart[r] + counts[r];

    const svg = el("svg");
    const NS = svg.namespaceURI; // the SVG namespace, without writing its URL here
    const gAll = el("all");
    const gFocus = el("focus");
    const layerSel = el("layer");
    const headSel = el("head");
    const status = el("status");
    const qCol = el("queries");
    const kCol = el("keys");
    const width = svg.getBoundingClientRect().width || 280;
    svg.setAttribute("height", Math.max(N, S) * ROW);
    svg.setAttribute("viewBox", `0 0 ${width} ${Math.max(N, S) * ROW}`);

    // pinned: the query shown alone when nothing is hovered (head_view(query=...), or a click).
    const pinned0 = D.initialQuery === undefined ? null : D.initialQuery;
    const state = { layer: D.initialLayer, head: D.initialHead, pinned: pinned0 };
    const color = () => (state.head === H ? MEAN_COLOR : PALETTE[state.head % PALETTE.length]);

    function option(sel, value, text) {
      const o = document.createElement("option");
      o.value = String(value);
      o.textContent = text;
      sel.appendChild(o);
    }
    D.layerNames.forEach((name, l) => option(layerSel, l, name));
    option(headSel, H, UI.mean);
    for (let h = 0; h < H; h++) option(headSel, h, headName(h));
    layerSel.value = String(state.layer);
    headSel.value = String(state.head);

    function tokenDiv(col, text, i, side) {
      const d = document.createElement("div");
      d.className = "ak-tok";
      d.tabIndex = 0;
      d.dataset.index = String(i);
      d.dataset.side = side;
      d.title = `${side === "q" ? UI.query : UI.key} ${i}: ${text}`;
      const idx = document.createElement("span");
      idx.className = "ak-idx";
      idx.textContent = String(i);
      const t = document.createElement("span");
      t.textContent = text;
      const w = document.createElement("span");
      w.className = "ak-w";
      if (side === "q") d.append(w, t, idx); else d.append(idx, t, w);
      col.appendChild(d);
      return d;
    }
    const qDivs = D.tokens.map((t, i) => tokenDiv(qCol, t, i, "q"));
    const kDivs = D.keyTokens.map((t, i) => tokenDiv(kCol, t, i, "k"));

    // Entries of the current matrix: calls fn(query, key, weight in [0, 1]).
    function forEachEntry(fn, onlyQuery) {
      const base = (state.layer * M + state.head) * N;
      const q0 = onlyQuery === undefined ? 0 : onlyQuery;
      const q1 = onlyQuery === undefined ? N : onlyQuery + 1;
      for (let q = q0; q < q1; q++) {
        for (let e = rowStart[base + q]; e < rowStart[base + q + 1]; e++) {
          fn(q, keys[e], wts[e] / D.quant);
        }
      }
    }

    function addLine(group, q, k, w, c) {
      const ln = document.createElementNS(NS, "line");
      ln.setAttribute("x1", 2);
      ln.setAttribute("y1", q * ROW + ROW / 2);
      ln.setAttribute("x2", width - 2);
      ln.setAttribute("y2", k * ROW + ROW / 2);
      ln.setAttribute("stroke", c);
      ln.setAttribute("stroke-opacity", w.toFixed(3));
      ln.setAttribute("stroke-width", 2.5);
      ln.setAttribute("class", "ak-line");
      ln.dataset.q = q;
      ln.dataset.k = k;
      ln.dataset.w = w.toFixed(3);
      group.appendChild(ln);
    }

    function shade(divs, weights) {
      divs.forEach((d, i) => {
        const w = weights ? weights[i] || 0 : 0;
        d.style.background = w > 0 ? hexAlpha(color(), Math.min(0.6, w)) : "";
        d.querySelector(".ak-w").textContent = w > 0 ? w.toFixed(2) : "";
      });
    }
    function hexAlpha(hex, a) {
      const n = parseInt(hex.slice(1), 16);
      return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${a.toFixed(3)})`;
    }

    function drawAll() {
      gAll.replaceChildren();
      const frag = document.createDocumentFragment();
      const c = color();
      let n = 0;
      forEachEntry((q, k, w) => { addLine(frag, q, k, w, c); n++; });
      gAll.appendChild(frag);
      el("swatch").style.background =
        `linear-gradient(to right, ${hexAlpha(c, 0)}, ${hexAlpha(c, 1)})`;
      status.textContent = `${D.layerNames[state.layer]}, ` +
        `${state.head === H ? UI.mean : headName(state.head)}: ${n} ${UI.lines}.`;
      rest();
    }

    // Back to the resting picture: the pinned query alone, else every line.
    function rest() {
      if (state.pinned === null) clearFocus(); else focus("q", state.pinned);
    }

    function focus(side, i) {
      clearFocus();
      const c = color();
      const shown = {};
      if (side === "q") {
        forEachEntry((q, k, w) => { addLine(gFocus, q, k, w, c); shown[k] = w; }, i);
        qDivs[i].classList.add("ak-active");
        shade(kDivs, shown);
      } else {
        forEachEntry((q, k, w) => { if (k === i) { addLine(gFocus, q, k, w, c); shown[q] = w; } });
        kDivs[i].classList.add("ak-active");
        shade(qDivs, shown);
      }
      svg.classList.add("ak-focused");
    }

    function clearFocus() {
      gFocus.replaceChildren();
      svg.classList.remove("ak-focused");
      for (const d of qDivs.concat(kDivs)) d.classList.remove("ak-active");
      shade(qDivs, null);
      shade(kDivs, null);
    }

    for (const d of qDivs.concat(kDivs)) {
      const go = () => focus(d.dataset.side, Number(d.dataset.index));
      d.addEventListener("mouseenter", go);
      d.addEventListener("focus", go);
      d.addEventListener("mouseleave", rest);
      d.addEventListener("blur", rest);
      if (d.dataset.side === "q") {
        d.addEventListener("click", () => {
          const i = Number(d.dataset.index);
          state.pinned = state.pinned === i ? null : i; // a second click lets go
          rest();
        });
      }
    }
    layerSel.addEventListener("change", () => { state.layer = Number(layerSel.value); drawAll(); });
    headSel.addEventListener("change", () => { state.head = Number(headSel.value); drawAll(); });

    const notes = el("notes-list");
    for (const text of D.notes) {
      const li = document.createElement("li");
      li.textContent = text;
      notes.appendChild(li);
    }
    drawAll();
    root.dataset.ready = "1";
  };
})(window);
