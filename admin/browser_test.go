package admin_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// The console in a real browser: headless Chromium (Debian's chromium package) driven by
// chromedp. Without Chromium these tests skip, saying so; with IDEMD_REQUIRE_BROWSER=1 (CI
// sets it) its absence fails them instead.

// chromium finds the browser, or skips (or fails) naming what is missing.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("IDEMD_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "BROWSER TESTS NOT RUN: headless Chromium is missing (no chromium, chromium-browser or google-chrome on PATH, IDEMD_CHROMIUM unset). Install it: apt-get install -y chromium"
	fmt.Fprintln(os.Stderr, msg)
	if os.Getenv("IDEMD_REQUIRE_BROWSER") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// browser starts a fresh headless Chromium (its own profile) and returns a tab's context.
func browser(t *testing.T) context.Context {
	t.Helper()
	exe := chromium(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(cancelTab)
	// The first call starts the browser; it must not carry a timeout (it would stop it).
	_, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void]("1"))
	require.NoError(t, err, "starting %s", exe)
	// Every later step is bounded: a page that never shows what a test waits for fails it.
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(cancel)
	// Confirmations (the console's window.confirm before a bulk replay or a disable) are
	// accepted, as an operator would. The listener must not call the browser itself.
	dialogs := make(chan struct{}, 8)
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			select {
			case dialogs <- struct{}{}:
			default:
			}
		}
	}))
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-dialogs:
				_ = chromedp.Do(ctx, func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
					_, err := cdp.Call(ctx, tg, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
					return chromedp.Void{}, err
				})
			}
		}
	}()
	return ctx
}

// screenshot saves the page as a test artefact (TEST_ARTIFACTS_DIR, default a directory in
// the temp dir) and, with IDEMD_UPDATE_DOCS_SCREENSHOTS=1, as docs/<docName> too.
func screenshot(t *testing.T, ctx context.Context, name, docName string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	dir := os.Getenv("TEST_ARTIFACTS_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "idemd-console-screenshots")
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot: %s", path)
	if docName != "" && os.Getenv("IDEMD_UPDATE_DOCS_SCREENSHOTS") != "" {
		require.NoError(t, os.WriteFile(filepath.Join("..", "docs", docName), png, 0o644))
	}
}

// signIn opens a deep link, is asked for the token, enters it once, and lands on the link.
func signIn(t *testing.T, ctx context.Context, b *bundle, link string) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.srv.URL+link),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), testToken),
		chromedp.Submit(chromedp.CSS("#token")),
	))
	waitJS(t, ctx, `document.title !== "Sign in · idemd" && !!document.querySelector("main h1")`)
	title, err := chromedp.Run(ctx, chromedp.Title())
	require.NoError(t, err)
	require.NotContains(t, title, "Sign in")
	loc, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	require.Equal(t, b.srv.URL+link, loc, "the deep link survives the sign-in")
}

// text is the visible text of the element of sel, once there is one. It is read by a
// script, not by chromedp.Text: right after a form's submission navigated, chromedp may
// still hold the node ids of the page before, and reading one fails with "No node with
// given id found" (seen in CI on TestBrowserDisableEnableEndpoint).
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	waitJS(t, ctx, fmt.Sprintf(`!!document.querySelector(%q)`, sel))
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).innerText`, sel)))
	require.NoError(t, err, sel)
	return strings.TrimSpace(s)
}

// waitText waits until the element of sel contains want.
func waitText(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	waitJS(t, ctx, fmt.Sprintf(`(() => { const e = document.querySelector(%q); return !!e && e.textContent.includes(%q); })()`, sel, want))
}

// waitJS waits until the page's predicate holds. A form's submission navigates, which ends
// a poll in progress: the wait then starts again on the new page.
func waitJS(t *testing.T, ctx context.Context, predicate string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](predicate, chromedp.WithPollingTimeout(time.Until(deadline))))
		if err == nil {
			return
		}
		require.True(t, time.Now().Before(deadline), "waiting for %s: %v", predicate, err)
	}
}

// Search for a message by id, by keyboard, and see its outcome and story.
func TestBrowserSearchMessageByID(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: testToken})
	ctx := browser(t)
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.gate VALUES (1)`))
	require.Equal(t, http.StatusOK, b.webhook(t, "hooks", "evt-search-1", `,"amount":12`))
	require.Equal(t, http.StatusOK, b.webhook(t, "hooks", "evt-other", ``))

	signIn(t, ctx, b, "/ui/messages")
	// "/" focuses the search field; type the id and press Enter.
	require.NoError(t, chromedp.Do(ctx, chromedp.KeyEvent("/")))
	active, err := chromedp.Run(ctx, chromedp.Evaluate[string]("document.activeElement.id"))
	require.NoError(t, err)
	require.Equal(t, "search", active, "/ focuses the search field")
	// The protocol's synthetic "/" also types a character the page's keydown handler cannot
	// cancel (a real keyboard's is cancelled): clear it.
	_, err = chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`document.activeElement.value = ""`))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx, chromedp.KeyEvent("evt-search-1"), chromedp.KeyEvent("\r")))
	// The unfiltered list already shows the message's link, so wait for the search's own
	// page: its address (a deep link) and a list without the other message.
	waitJS(t, ctx, `location.search.includes("id=evt-search-1") && document.readyState === "complete" &&
		!!document.querySelector('a[href="/ui/messages/hooks/evt-search-1"]') &&
		!document.querySelector('a[href="/ui/messages/hooks/evt-other"]')`)
	rows := text(t, ctx, "tbody")
	require.Contains(t, rows, "evt-search-1")
	require.Contains(t, rows, "processed")
	require.NotContains(t, rows, "evt-other")
	screenshot(t, ctx, "search.png", "")

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`a[href="/ui/messages/hooks/evt-search-1"]`)),
		chromedp.WaitVisible(chromedp.CSS("#outcome")),
	))
	require.Equal(t, "processed", text(t, ctx, "#outcome"))
	require.Equal(t, "applied", text(t, ctx, "#effect"))
	screenshot(t, ctx, "message.png", "console-message.png")
}

// Dry-run a bulk replay, then run it: the letters are shown replayed and each effect ran
// once.
func TestBrowserBulkReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: testToken})
	ctx := browser(t)
	b.deadLetters(t, "hooks", "evt", 6)
	b.deadLetters(t, "other", "keep", 2)

	signIn(t, ctx, b, "/ui/dead-letters?pipeline=hooks")
	rows := text(t, ctx, "tbody")
	require.Contains(t, rows, "evt-0005")
	require.Contains(t, rows, "null value in column")
	require.NotContains(t, rows, "keep-")
	require.Equal(t, 6, strings.Count(rows, "not replayed"))

	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#dry-run"))))
	waitText(t, ctx, "#flash", "Dry run: 6 letters match")
	require.Equal(t, 0, b.db.Count(t, "{schema}.effects"), "a dry run replays nothing")

	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.gate VALUES (1)`)) // the cause is fixed
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#replay-all"))))
	waitText(t, ctx, "#flash", "Bulk replay: 6 matched, 6 replayed, 0 skipped, 0 failed")
	rows = text(t, ctx, "tbody")
	require.Equal(t, 6, strings.Count(rows, "replayed 20"), rows)
	require.NotContains(t, rows, "not replayed")
	screenshot(t, ctx, "dead-letters.png", "console-dead-letters.png")

	require.Equal(t, 6, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, 0, b.db.Count(t, "(SELECT message_id FROM {schema}.effects GROUP BY message_id HAVING count(*) > 1) AS twice"))
	require.Equal(t, 2, b.db.Count(t, "{schema}.dead_letters WHERE replayed_at IS NULL"), "the other pipeline's letters are untouched")

	// Running it again finds nothing left to replay.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#replay-all"))))
	waitText(t, ctx, "#flash", "Bulk replay: 0 matched")
	require.Equal(t, 6, b.db.Count(t, "{schema}.effects"))
}

// Disable and enable an endpoint.
func TestBrowserDisableEnableEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: testToken})
	ctx := browser(t)
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.http_endpoints (name, url) VALUES ('erp', 'https://erp.example/hooks/s3cr3t')`))
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.http_deliveries (endpoint, operation_id, pipeline, causation_id, payload)
		VALUES ('erp', gen_random_uuid(), 'hooks', 'evt-1', '{}')`))

	signIn(t, ctx, b, "/ui/deliveries")
	require.Equal(t, "enabled", text(t, ctx, "#endpoint-erp .endpoint-state"))
	require.NotContains(t, text(t, ctx, "#endpoint-erp"), "s3cr3t")

	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#endpoint-erp button`))))
	waitText(t, ctx, "#flash", "Endpoint erp disabled")
	require.Equal(t, "disabled", text(t, ctx, "#endpoint-erp .endpoint-state"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.http_endpoints WHERE name = 'erp' AND disabled_at IS NOT NULL"))
	screenshot(t, ctx, "deliveries-disabled.png", "")

	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#endpoint-erp button`))))
	waitText(t, ctx, "#flash", "Endpoint erp enabled")
	require.Equal(t, "enabled", text(t, ctx, "#endpoint-erp .endpoint-state"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.http_endpoints WHERE name = 'erp' AND disabled_at IS NULL"))
	require.Equal(t, 2, b.db.Count(t, "{schema}.admin_audit WHERE actor = 'admin' AND target = 'erp'"))
}
