// Typesets the formulas pymdownx.arithmatex (generic mode) leaves in a page: inline math as
// <span class="arithmatex">\(...\)</span>, display math as <div class="arithmatex">\[...\]</div>.
// KaTeX itself is served from assets/vendor/katex/ (no CDN: the site works offline).
(function () {
  "use strict";
  function typeset(root) {
    root.querySelectorAll(".arithmatex").forEach(function (el) {
      if (el.querySelector(".katex")) return; // already typeset
      var tex = el.textContent.trim().replace(/^\\[([]/, "").replace(/\\[)\]]$/, "");
      katex.render(tex, el, { displayMode: el.tagName === "DIV", throwOnError: false });
    });
  }
  if (typeof document$ !== "undefined") {
    document$.subscribe(function () { typeset(document); }); // Material's page observable
  } else {
    document.addEventListener("DOMContentLoaded", function () { typeset(document); });
  }
})();
