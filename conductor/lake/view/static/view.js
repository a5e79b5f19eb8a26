// conductor lake view: the only script. Fills in counts that need a full scan, after the page is shown.
(function () {
  "use strict";
  var el = document.getElementById("count");
  if (el && el.dataset.src) {
    fetch(el.dataset.src, { headers: { "Accept": "application/json" } })
      .then(function (r) { return r.json(); })
      .then(function (d) {
        el.textContent = d.count === undefined ? "" : d.count.toLocaleString("en-US") + " matching";
        el.dataset.count = d.count;
      })
      .catch(function () { el.textContent = ""; });
  }
})();
