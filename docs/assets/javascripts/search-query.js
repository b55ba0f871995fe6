// Search result links highlight the whole query on the page they open.
//
// Material (9.x) writes `?h=` from the query's *clauses*, and its search worker cuts a run of
// Han characters into the longest pieces the index holds that are shorter than the run
// (integrations/search/query/segment: `for (j = i + 1; j < query.length; j++)` never tries
// the whole run). So 掩码 is searched as 掩* wherever 掩 is a token of some page, and the
// link says `?h=掩`: the page then marks every 掩, not the word. Here each result link gets
// the query as typed instead, for queries with Han characters (English clauses already are
// the typed words). Material's highlighter splits `h` at the index separator and marks each
// part, so `h=掩码` marks 掩码.
(function () {
  "use strict";
  var HAN = /[\u3400-\u4dbf\u4e00-\u9fff]/;

  function rewrite(results, query) {
    var links = results.querySelectorAll("a[href]");
    for (var i = 0; i < links.length; i++) {
      var url = new URL(links[i].href, document.baseURI);
      if (url.searchParams.get("h") !== query) {
        url.searchParams.set("h", query);
        links[i].href = url.href;
      }
    }
  }

  function start() {
    var input = document.querySelector(".md-search__input");
    var results = document.querySelector(".md-search-result");
    if (!input || !results) return;
    new MutationObserver(function () {
      var query = input.value.trim();
      if (HAN.test(query)) rewrite(results, query);
    }).observe(results, { childList: true, subtree: true });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
