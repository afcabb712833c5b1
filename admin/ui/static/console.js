// idemd console: keyboard shortcuts and confirmations. Every page works without it.
(function () {
  "use strict";
  var pages = { m: "/ui/messages", d: "/ui/dead-letters", c: "/ui/conflicts", o: "/ui/outbox", e: "/ui/deliveries", k: "/ui/consumers" };
  var pendingG = false;
  document.addEventListener("keydown", function (ev) {
    var t = ev.target;
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    if (t && (t.tagName === "INPUT" || t.tagName === "SELECT" || t.tagName === "TEXTAREA")) return;
    if (ev.key === "/") {
      var s = document.querySelector("[data-search]");
      if (s) { ev.preventDefault(); s.focus(); s.select(); }
      return;
    }
    if (pendingG && pages[ev.key]) { window.location.href = pages[ev.key]; }
    pendingG = ev.key === "g";
  });
  document.addEventListener("click", function (ev) {
    var b = ev.target.closest ? ev.target.closest("[data-confirm]") : null;
    if (b && !window.confirm(b.getAttribute("data-confirm"))) { ev.preventDefault(); }
  });
})();
