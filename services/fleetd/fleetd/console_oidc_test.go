package fleetd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/fleetstream/fleetstream/pkg/server/oidctest"
)

// consoleClientID is the console's OIDC client at the test issuer, and fleetd's --oidc-client-id.
const consoleClientID = "fleetstream-console"

// erin is who the test issuer signs in: a member of the group that views team-a.
var erin = map[string]any{"sub": "erin", "groups": []string{"team-a-viewers"}}

// consoleOIDCSignIn signs in with the test issuer through the browser (authorization code with
// PKCE, the issuer approving erin at once): the Fleet page shows what the API gives erin's ID
// token, the Projects page only team-a (erin's group views it), and neither the code nor the
// flow's secrets stay in the address bar or in storage. An answer whose state this tab did not
// send is refused without redeeming its code.
func consoleOIDCSignIn(t *testing.T, b *browser, api *rawClient, is *oidctest.Issuer) {
	base := api.base
	// Signed out, whatever ran before.
	b.run(t, "sign out", chromedp.Navigate(base+"/ui/"), chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Evaluate[*string](`sessionStorage.clear()`)(ctx, tg)
		return err
	}), b.load(base, "#/fleet"), chromedp.WaitVisible(chromedp.ID("signin-oidc")))
	if got, want := b.texts(t, "#signin-oidc"), "Sign in with "+strings.TrimPrefix(is.URL(), "https://"); !slices.Equal(got, []string{want}) {
		t.Errorf("issuer button %q, want %q", got, want)
	}
	redeemed := is.TokenHits.Load()
	b.run(t, "sign in with the issuer", chromedp.Click(chromedp.ID("signin-oidc")))
	b.waitPage(t, "fleet")
	if n := is.TokenHits.Load() - redeemed; n != 1 {
		t.Errorf("token endpoint called %d times, want once", n)
	}
	if loc := eval[string](t, b, `location.href`); loc != base+"/ui/" {
		t.Errorf("after sign-in the address is %q, want %s/ui/ (no code, no state)", loc, base)
	}
	if keys := eval[[]string](t, b, `Object.keys(sessionStorage)`); !slices.Equal(keys, []string{"fleetstream.token"}) {
		t.Errorf("session storage holds %q, want the token only (no verifier, state or nonce)", keys)
	}
	if n := eval[int](t, b, `localStorage.length`); n != 0 {
		t.Errorf("local storage holds %d items", n)
	}
	tok := eval[string](t, b, `sessionStorage.getItem("fleetstream.token")`)

	// The page shows what fleetd gives this token, which is erin's as a team-a viewer.
	var clusters struct {
		Clusters []struct {
			Name string `json:"name"`
		} `json:"clusters"`
	}
	if code := callWithBearer(t, base, tok, "/fleetstream.cluster.v1.ClusterService/ListClusters", &clusters); code != http.StatusOK {
		t.Fatalf("ListClusters with the console's ID token: HTTP %d", code)
	}
	var want []string
	for _, c := range clusters.Clusters {
		want = append(want, c.Name)
	}
	t.Logf("clusters ListClusters gives erin's ID token: %q", want)
	if got := b.texts(t, "#clusters tbody th"); !slices.Equal(got, want) {
		t.Errorf("Fleet page rows %q, want the API's for the same token %q", got, want)
	}
	b.run(t, "projects", b.load(base, "#/projects"))
	b.waitPage(t, "projects")
	if got := b.texts(t, "#project option"); len(got) != 1 || !strings.HasPrefix(got[0], "team-a") {
		t.Errorf("erin's projects %q, want team-a only", got)
	}
	b.noErrors(t, "oidc sign-in")

	t.Run("the issuer's refusal and another sign-in's ID token are refused", func(t *testing.T) {
		defer is.SetLogin(t, erin)
		for _, tc := range []struct {
			login map[string]any
			want  string
		}{
			{login: nil, want: "the identity provider refused: access_denied"},
			{login: map[string]any{"sub": "erin", "groups": []string{"team-a-viewers"}, "nonce": "another-sign-in"}, want: "nonce mismatch"},
		} {
			is.SetLogin(t, tc.login)
			b.run(t, "sign out", chromedp.Click(chromedp.ID("signout")), chromedp.WaitVisible(chromedp.ID("signin-oidc")))
			b.run(t, "sign in with the issuer", chromedp.Click(chromedp.ID("signin-oidc")), chromedp.WaitVisible(chromedp.ID("signin-error")))
			if msg := b.texts(t, "#signin-error"); len(msg) != 1 || !strings.Contains(msg[0], tc.want) {
				t.Errorf("sign-in error %q, want %q", msg, tc.want)
			}
			if keys := eval[[]string](t, b, `Object.keys(sessionStorage)`); len(keys) != 0 {
				t.Errorf("session storage after a refused sign-in: %q", keys)
			}
			if loc := eval[string](t, b, `location.href`); loc != base+"/ui/" {
				t.Errorf("address after a refused sign-in %q", loc)
			}
			// Signed in again for the next case's sign-out.
			b.signIn(t, "token-viewer")
			b.waitPage(t, "fleet")
		}
		b.noErrors(t, "refused sign-ins")
	})

	t.Run("a forged state is refused", func(t *testing.T) {
		b.run(t, "sign out", chromedp.Click(chromedp.ID("signout")), chromedp.WaitVisible(chromedp.ID("signin-oidc")))
		// This tab has a sign-in of its own under way (login CSRF: an attacker's link brings
		// the attacker's code into it), as begin in oidc.js leaves it before leaving for the issuer.
		pending := fmt.Sprintf(`sessionStorage.setItem("fleetstream.oidc", JSON.stringify({verifier: "v".repeat(43), state: "genuine", nonce: "n",
			redirectUri: location.origin + "/ui/", clientId: %q, tokenEndpoint: %q}))`, consoleClientID, is.URL()+"/token")
		redeemed := is.TokenHits.Load()
		b.run(t, "forged callback", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[*string](pending)(ctx, tg)
			return err
		}), chromedp.Navigate(base+"/ui/?code=stolen&state=forged"), chromedp.WaitVisible(chromedp.ID("signin-error")))
		if msg := b.texts(t, "#signin-error"); len(msg) != 1 || !strings.Contains(msg[0], "state") {
			t.Errorf("sign-in error %q, want the state refused", msg)
		}
		if n := is.TokenHits.Load() - redeemed; n != 0 {
			t.Errorf("a forged answer's code was sent to the token endpoint (%d calls)", n)
		}
		if loc := eval[string](t, b, `location.href`); strings.Contains(loc, "stolen") || strings.Contains(loc, "forged") {
			t.Errorf("the refused answer stays in the address: %q", loc)
		}
		if keys := eval[[]string](t, b, `Object.keys(sessionStorage)`); len(keys) != 0 {
			t.Errorf("session storage after a refused answer: %q", keys)
		}
		if rows := b.texts(t, "#clusters tbody tr"); len(rows) != 0 {
			t.Errorf("page data shown after a refused answer: %q", rows)
		}
		b.noErrors(t, "forged state")
	})
}

// callWithBearer makes a unary Connect JSON call with token and decodes a 200 answer into out.
func callWithBearer(t *testing.T, base, token, proc string, out any) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+proc, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("%s: %v", proc, err)
		}
	}
	return res.StatusCode
}
