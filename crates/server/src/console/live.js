// Parts of a console page marked `data-live` change on their own (a row's run ends, a job
// moves): every two seconds the page is read again and those parts are swapped in when they
// differ, so a person watching sees it without a reload. Everything else, forms included, is
// left alone; without this script the page is the same, only still until reloaded.
(function () {
  "use strict";
  function parts() {
    return Array.prototype.slice.call(document.querySelectorAll("[data-live][id]"));
  }
  if (parts().length === 0) {
    return;
  }
  function refresh() {
    if (document.hidden) {
      return;
    }
    fetch(location.href, { cache: "no-store", credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) {
          return;
        }
        var next = new DOMParser().parseFromString(html, "text/html");
        parts().forEach(function (el) {
          var fresh = next.getElementById(el.id);
          if (fresh && fresh.innerHTML !== el.innerHTML) {
            el.innerHTML = fresh.innerHTML;
          }
        });
      })
      .catch(function () { /* the next tick tries again */ });
  }
  setInterval(refresh, 2000);
})();
