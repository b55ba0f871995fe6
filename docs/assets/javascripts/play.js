// Interactive figures of the tutorials: plain JavaScript and inline SVG, nothing fetched.
// A page asks for one with <div class="ak-play" data-play="softmax|row|mask"></div>; the
// numbers come from play-data.js (window.AK_PLAY), which tests/docs/make_play.py computes with
// attnkit, and tests/docs/test_play.py checks in headless Chromium that what the figures show
// is attnkit's softmax, weights and block map.
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var TEXT = {
    en: {
      divisor: "divide the scores by",
      sharp: "largest weight",
      entropy: "spread (entropy)",
      key: "key",
      query: "query token",
      weights: "weights of query",
      scores: "scaled scores",
      future: "future: −∞ → weight 0",
      sum: "sum",
      click: "Click cells to allow (dark) or hide (light) a (query, key) pair; blocks of",
      density: "density",
      full: "█ full",
      partial: "░ partial",
      empty: "blank: empty (skipped)",
      presets: { causal: "causal", window: "window 4", prefix: "prefix 6", documents: "3 documents", all: "all", none: "none" },
      mask: "mask (N × S)",
      blocks: "block map",
    },
    zh: {
      divisor: "分数除以",
      sharp: "最大的权重",
      entropy: "分散程度（熵）",
      key: "键",
      query: "查询词元",
      weights: "查询的权重：",
      scores: "缩放后的分数",
      future: "未来：−∞ → 权重 0",
      sum: "合计",
      click: "点击格子，允许（深色）或遮住（浅色）一个（查询，键）对；分块大小",
      density: "密度",
      full: "█ 全可见",
      partial: "░ 部分可见",
      empty: "空白：全遮住（跳过）",
      presets: { causal: "因果", window: "窗口 4", prefix: "前缀 6", documents: "3 篇文档", all: "全部", none: "清空" },
      mask: "掩码 (N × S)",
      blocks: "分块图",
    },
  };

  function el(tag, attrs, parent, ns) {
    var node = ns ? document.createElementNS(SVG, tag) : document.createElement(tag);
    for (var k in attrs || {}) {
      if (k === "text") node.textContent = attrs[k];
      else node.setAttribute(k, attrs[k]);
    }
    if (parent) parent.appendChild(node);
    return node;
  }

  // softmax of `scores / divisor`, with null (a masked score) = −∞; an all-masked row is 0
  function softmax(scores, divisor) {
    var top = -Infinity;
    scores.forEach(function (s) { if (s !== null) top = Math.max(top, s / divisor); });
    var e = scores.map(function (s) { return s === null ? 0 : Math.exp(s / divisor - top); });
    var total = e.reduce(function (a, b) { return a + b; }, 0);
    return e.map(function (x) { return total > 0 ? x / total : 0; });
  }

  function bars(svg, values, labels, width, height) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var n = values.length, w = width / n, top = 18, base = height - 18;
    values.forEach(function (v, i) {
      var h = (base - top) * Math.max(0, v);
      el("rect", { x: i * w + 3, y: base - h, width: w - 6, height: h, class: "ak-bar",
                   "data-value": v.toFixed(6) }, svg, true);
      el("text", { x: i * w + w / 2, y: base - h - 4, "text-anchor": "middle", class: "ak-num",
                   text: v.toFixed(2) }, svg, true);
      el("text", { x: i * w + w / 2, y: height - 4, "text-anchor": "middle", class: "ak-label",
                   text: labels[i] }, svg, true);
    });
  }

  function softmaxFigure(box, data, t) {
    var p = el("p", {}, box);
    el("label", { text: t.divisor + " " }, p);
    var slider = el("input", { type: "range", min: "0.25", max: "16", step: "0.25",
                               value: String(data.default), "aria-label": t.divisor }, p);
    var shown = el("output", { class: "ak-divisor" }, p);
    var svg = el("svg", { viewBox: "0 0 600 190", class: "ak-svg", role: "img" }, box, true);
    var info = el("p", { class: "ak-info" }, box);
    var labels = data.scores.map(function (_, i) { return t.key + " " + i; });
    function draw() {
      var d = Number(slider.value);
      var w = softmax(data.scores, d);
      var ent = -w.reduce(function (a, x) { return a + (x > 0 ? x * Math.log(x) : 0); }, 0);
      shown.textContent = " " + d.toFixed(2) + (d === data.default ? " = √d_k" : "");
      bars(svg, w, labels, 600, 190);
      info.textContent = t.sharp + " " + Math.max.apply(null, w).toFixed(3) + " · " + t.entropy +
        " " + ent.toFixed(3) + " (max " + Math.log(w.length).toFixed(3) + ")";
    }
    slider.addEventListener("input", draw);
    draw();
  }

  function rowFigure(box, data, t) {
    var n = data.weights.length, p = el("p", {}, box);
    el("label", { text: t.query + " " }, p);
    var select = el("select", { "aria-label": t.query }, p);
    for (var i = 0; i < n; i++) el("option", { value: String(i), text: String(i) }, select);
    select.value = String(data.default);
    var scores = el("p", { class: "ak-info ak-scores" }, box);
    var svg = el("svg", { viewBox: "0 0 600 190", class: "ak-svg", role: "img" }, box, true);
    var info = el("p", { class: "ak-info" }, box);
    var labels = data.weights.map(function (_, j) { return t.key + " " + j; });
    function draw() {
      var q = Number(select.value), row = data.weights[q];
      scores.textContent = t.scores + ": " + data.scores[q].map(function (s) {
        return s === null ? "−∞" : s.toFixed(3);
      }).join("  ");
      bars(svg, row, labels, 600, 190);
      var sum = row.reduce(function (a, b) { return a + b; }, 0);
      info.textContent = t.weights + " " + q + " · " + t.sum + " " + sum.toFixed(3) +
        (q < n - 1 ? " · " + t.future : "");
    }
    select.addEventListener("change", draw);
    draw();
  }

  // attnkit's block classes (functional/_block_scan.py): 2 full, 1 partial, 0 empty
  function blockMap(mask, bq, bk) {
    var n = mask.length, s = mask[0].length, out = [];
    for (var i0 = 0; i0 < n; i0 += bq) {
      var row = [];
      for (var j0 = 0; j0 < s; j0 += bk) {
        var seen = 0, total = 0;
        for (var i = i0; i < Math.min(i0 + bq, n); i++)
          for (var j = j0; j < Math.min(j0 + bk, s); j++) { seen += mask[i][j]; total++; }
        row.push(seen === total ? 2 : seen === 0 ? 0 : 1);
      }
      out.push(row);
    }
    return out;
  }

  function maskFigure(box, data, t) {
    var n = data.n, b = data.block, cell = 18, mask;
    var p = el("p", { class: "ak-presets" }, box);
    el("span", { text: t.click + " " + b + "×" + b + ". " }, p);
    var wrap = el("div", { class: "ak-mask-row" }, box);
    var grid = el("svg", { viewBox: "0 0 " + (n * cell + 2) + " " + (n * cell + 2), class: "ak-grid",
                           "aria-label": t.mask }, wrap, true);
    var side = n * cell + 2, nb = Math.ceil(n / b);
    var blockSvg = el("svg", { viewBox: "0 0 " + side + " " + side, class: "ak-grid ak-blocks",
                               role: "img", "aria-label": t.blocks }, wrap, true);
    var blockRects = [];
    for (var bi = 0; bi < nb; bi++) {
      for (var bj = 0; bj < nb; bj++) {
        var x = 1 + bj * b * cell, y = 1 + bi * b * cell, w = b * cell - 1;
        blockRects.push(el("rect", { x: x, y: y, width: w, height: w }, blockSvg, true));
        blockRects.push(el("text", { x: x + w / 2, y: y + w / 2 + 8, "text-anchor": "middle",
                                     class: "ak-block-sign" }, blockSvg, true));
      }
    }
    var info = el("p", { class: "ak-info ak-density" }, box);
    el("p", { class: "ak-info", text: t.full + " · " + t.partial + " · " + t.empty }, box);
    var rects = [];
    for (var i = 0; i < n; i++) {
      rects.push([]);
      for (var j = 0; j < n; j++) {
        var r = el("rect", { x: 1 + j * cell, y: 1 + i * cell, width: cell - 1, height: cell - 1,
                             "data-q": i, "data-k": j, class: "ak-cell" }, grid, true);
        r.addEventListener("click", toggle);
        rects[i].push(r);
      }
    }
    function toggle(event) {
      var q = Number(event.target.getAttribute("data-q"));
      var k = Number(event.target.getAttribute("data-k"));
      mask[q][k] = 1 - mask[q][k];
      draw();
    }
    function load(name) {
      mask = data.presets[name].map(function (row) {
        return row.split("").map(Number);
      });
      draw();
    }
    function draw() {
      var seen = 0;
      for (var i = 0; i < n; i++)
        for (var j = 0; j < n; j++) {
          rects[i][j].setAttribute("class", "ak-cell" + (mask[i][j] ? " ak-on" : ""));
          seen += mask[i][j];
        }
      var blocks = blockMap(mask, b, b);
      blocks.forEach(function (row, bi) {
        row.forEach(function (c, bj) {
          var k = 2 * (bi * row.length + bj);
          blockRects[k].setAttribute("class", ["ak-empty", "ak-partial", "ak-full"][c]);
          blockRects[k + 1].textContent = c === 2 ? "█" : c === 1 ? "░" : "";
        });
      });
      blockSvg.setAttribute("data-blocks", JSON.stringify(blocks));
      info.textContent = t.density + " " + (seen / (n * n)).toFixed(3);
      info.setAttribute("data-density", String(seen / (n * n)));
    }
    Object.keys(data.presets).forEach(function (name) {
      var button = el("button", { type: "button", "data-preset": name, class: "md-button",
                                  text: t.presets[name] || name }, p);
      button.addEventListener("click", function () { load(name); });
    });
    load(data.default);
  }

  var FIGURES = { softmax: softmaxFigure, row: rowFigure, mask: maskFigure };

  function start() {
    var data = window.AK_PLAY || {};
    var lang = (document.documentElement.lang || "en").slice(0, 2) === "zh" ? "zh" : "en";
    document.querySelectorAll(".ak-play[data-play]").forEach(function (box) {
      var kind = box.getAttribute("data-play");
      if (!FIGURES[kind] || !data[kind] || box.getAttribute("data-ready")) return;
      FIGURES[kind](box, data[kind], TEXT[lang]);
      box.setAttribute("data-ready", "1");
    });
  }

  window.akPlay = { softmax: softmax, blockMap: blockMap };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
