"""The page's own OIDC sign-in in a real headless Chromium, against the tests' real OpenID Connect provider
(tests/helpers/idp.py, a confidential client with PKCE) over a 2-node dev cluster with the repair service: a viewer
signs in, sees the page and is refused an approval; an operator signs in and approves a repair, which the Repair
tab and `slurm-ext history` name them in; logout ends the session; an expired session asks to sign in again.

The page runs standalone (`slurm-ext web`, as the controller agent runs it) with [oidc] and web.oidc_* added to the
cluster's config; the IdP's callback comes back to it on 127.0.0.1 over plain http (loopback). Chromium as in
tests/test_web_cluster.py (its fixture and helpers are reused)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time

import pytest
from selenium.webdriver.common.by import By

from helpers.cluster import TEST_CLUSTER, RepairCluster, cluster_of_its_own
from helpers.idp import TestIdP
from helpers.wait import wait_for
import test_web_cluster
from test_web_cluster import _journal, _reachable, shoot, text_of, until

pytestmark = pytest.mark.cluster

OIDC_CLUSTER = {**TEST_CLUSTER, "cluster_name": "slurmextoidc", "node_name": "onode1", "nodes": 2,
                "slurmctld_port": 19617, "slurmd_port": 19618, "slurmdbd_port": 19619, "mariadb_port": 13349,
                "controller_probe_port": 19940, "worker_probe_port": 19941, "accounting_probe_port": 19942,
                "web_port": 0, "node_port_base": 19944, "kernel_log": "", "health_interval": 1.0,
                "repair_interval": 1.0, "resume_timeout": 30}
NODES = ["onode1", "onode2"]
#: Chromium, as the page's other browser tests start it
browser = test_web_cluster.browser
#: the standalone page with sign-in
PAGE_PORT = 19949
#: a second page, where viewing needs sign-in
SIGNED_IN_PORT = 19948
#: short, so that the expiry is seen within the test (the lowest the setting takes)
LIFETIME = 60
USERS = {"ada": {"groups": ["slurm-users", "slurm-operators"], "name": "Ada Lovelace", "email": "ada@example.org"},
         "vic": {"groups": ["slurm-users"], "name": "Vic Viewer"}}
ADA = "Ada Lovelace <ada@example.org> (oidc:ada)"
VIC = "Vic Viewer (oidc:vic)"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("oidc-page")
    secret = scratch / "client-secret"
    secret.write_text("c" * 48 + "\n")
    os.chmod(secret, 0o600)
    with TestIdP(users=USERS, client_id="slurm-ext-page", client_secret="c" * 48) as idp, \
            cluster_of_its_own("slurm-ext-oidc-", **OIDC_CLUSTER) as settings:
        cluster = RepairCluster(settings)
        conf = scratch / "page.toml"
        conf.write_text(cluster.layout.slurm_ext_conf.read_text().replace(
            "[web]\n", f'[web]\noidc_client_id = "slurm-ext-page"\noidc_client_secret_file = "{secret}"\n'
                       'roles = { viewer = ["slurm-users"], operator = ["slurm-operators"] }\n'
                       f'session_lifetime = "{LIFETIME}s"\n')
            + f'\n[oidc]\nissuer = "{idp.issuer}"\n')
        log = (scratch / "web.out").open("w")
        page = subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "--config", str(conf), "web", "--listen",
                                 f"127.0.0.1:{PAGE_PORT}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            cluster.url = f"http://127.0.0.1:{PAGE_PORT}/"
            wait_for("the page with sign-in", lambda: _reachable(cluster.url), 30, interval=0.2)
            cluster.idp, cluster.page_log, cluster.conf = idp, scratch / "web.out", conf
            yield cluster
        finally:
            page.terminate()
            page.wait(30)
            log.close()


@pytest.fixture
def web(site):
    yield site
    site.settle(NODES)


def sign_in(browser, web, user: str, role: str, person: str) -> None:
    """Through the page's Sign in button and the IdP's form, as a person does."""
    browser.get(web.url + "#nodes")
    until(browser, "the sign-in button", lambda b: b.find_element(By.ID, "signin").is_displayed())
    browser.find_element(By.ID, "signin").click()
    until(browser, "the IdP's form", lambda b: b.find_elements(By.ID, "user") and "Test IdP" in b.title)
    browser.find_element(By.ID, "user").send_keys(user)
    browser.find_element(By.ID, "signin").click()
    until(browser, f"{user} signed in", lambda b: text_of(b, "#who") == f"{role}: {person}")
    assert browser.find_element(By.ID, "signout").is_displayed()
    assert not browser.find_element(By.ID, "signin").is_displayed()
    browser.get(web.url + "#nodes")  # the IdP sends the browser back to the page's first tab
    until(browser, "still signed in", lambda b: text_of(b, "#who") == f"{role}: {person}")


def sign_out(browser) -> None:
    browser.find_element(By.ID, "signout").click()
    until(browser, "signed out", lambda b: text_of(b, "#who") == "viewing" and b.current_url.startswith("http://127.0.0.1:19949/"))


def _status_with(cookie: str, path: str = "/api/cluster") -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", PAGE_PORT, timeout=30)
    try:
        connection.request("GET", path, headers={"Cookie": f"slurm_ext_session={cookie}"})
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")
    finally:
        connection.close()


def test_a_viewer_signs_in_sees_the_page_and_is_refused_an_approval_then_signs_out(web, browser):
    web.drill("onode2", "xid-79", gpu=1)
    record = web.record("onode2", "recommended")
    browser.delete_all_cookies()
    sign_in(browser, web, "vic", "viewer", VIC)
    approve = "#node-table tr[data-node=onode2] button.op-approve"
    until(browser, "onode2's approve button", lambda b: b.find_elements(By.CSS_SELECTOR, approve))
    browser.find_element(By.CSS_SELECTOR, approve).click()
    until(browser, "the viewer refused", lambda b: "your role viewer cannot approve repairs: operator or admin "
          "needed" in text_of(b, "#message"))
    assert [r["state"] for r in web.all_records("onode2") if r["id"] == record["id"]] == ["recommended"]
    shoot(browser, "oidc-viewer-refused")
    cookie = browser.get_cookie("slurm_ext_session")["value"]
    assert cookie and browser.get_cookie("slurm_ext_session")["httpOnly"]
    sign_out(browser)
    assert browser.get_cookie("slurm_ext_session") is None and "GET /realm/logout" in web.idp.requests
    status, answer = _status_with(cookie)  # a copy of the cookie: ended with the logout
    assert status == 401 and "signed out" in answer["error"]
    events = {e["event"]: e for e in _journal(web) if e["event"] in ("web-signin", "web-signout")}
    assert events["web-signin"]["user"] == VIC and events["web-signout"]["user"] == VIC


def test_an_operator_signs_in_approves_and_the_repair_tab_and_history_name_them(web, browser):
    web.drill("onode2", "xid-79", gpu=1)
    record = web.record("onode2", "recommended")
    browser.delete_all_cookies()
    sign_in(browser, web, "ada", "operator", ADA)
    approve = "#node-table tr[data-node=onode2] button.op-approve"
    until(browser, "onode2's approve button", lambda b: b.find_elements(By.CSS_SELECTOR, approve))
    browser.find_element(By.CSS_SELECTOR, approve).click()
    until(browser, "the approval", lambda b: "approved reboot of node onode2" in text_of(b, "#message")
          and f"(by {ADA})" in text_of(b, "#message"))
    done = wait_for("the repair done", lambda: next((r for r in web.all_records("onode2")
                                                     if r["id"] == record["id"] and r["state"] == "done"), None),
                    120, interval=1.0)
    assert done["decided_by"] == ADA
    history = web.history("onode2")
    assert any(e.get("user") == ADA and "approved" in e.get("event", "") for e in history), history
    browser.get(web.url + "#repair")
    until(browser, "the Repair tab names the person", lambda b: ADA in text_of(b, "#tab-repair"))
    shoot(browser, "oidc-operator-approved")
    assert any(e["event"] == "web-operation" and e.get("user") == ADA for e in _journal(web))
    sign_out(browser)


def test_an_expired_session_asks_to_sign_in_again(web, browser):
    browser.delete_all_cookies()
    sign_in(browser, web, "vic", "viewer", VIC)
    began = time.monotonic()
    browser.get(web.url + "#overview")
    until(browser, "the page asks to sign in again", lambda b: b.find_element(By.ID, "signin-prompt").is_displayed()
          and "sign in again" in text_of(b, "#signin-prompt"), timeout=LIFETIME + 30)
    assert time.monotonic() - began >= LIFETIME - 5  # not before its time
    assert text_of(browser, "#who") == "viewing" and browser.get_cookie("slurm_ext_session") is None
    shoot(browser, "oidc-expired")
    assert browser.find_element(By.ID, "signin-prompt-button").is_displayed()


def test_where_viewing_needs_sign_in_the_page_shows_only_the_prompt_until_one_signs_in(web, browser, tmp_path):
    """A second page on the same cluster with web.viewing = "signed-in" (its own port; its cookie is its own key's)."""
    conf = tmp_path / "signed-in.toml"
    conf.write_text(web.conf.read_text().replace("[web]\n", '[web]\nviewing = "signed-in"\n'))
    log = (tmp_path / "web.out").open("w")
    page = subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "--config", str(conf), "web", "--listen",
                             f"127.0.0.1:{SIGNED_IN_PORT}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{SIGNED_IN_PORT}/"
        wait_for("the page where viewing needs sign-in", lambda: _reachable(url), 30, interval=0.2)
        browser.delete_all_cookies()
        browser.get(url + "#overview")
        until(browser, "only the sign-in prompt", lambda b: b.find_element(By.ID, "signin-prompt").is_displayed()
              and not b.find_element(By.TAG_NAME, "main").is_displayed())
        assert "Viewing this page needs sign-in." in text_of(browser, "#signin-prompt")
        shoot(browser, "oidc-signin-needed")
        browser.find_element(By.ID, "signin-prompt-button").click()
        until(browser, "the IdP's form", lambda b: b.find_elements(By.ID, "user") and "Test IdP" in b.title)
        browser.find_element(By.ID, "user").send_keys("vic")
        browser.find_element(By.ID, "signin").click()
        until(browser, "the page shown to the viewer", lambda b: text_of(b, "#who") == f"viewer: {VIC}"
              and b.find_element(By.TAG_NAME, "main").is_displayed()
              and not b.find_element(By.ID, "signin-prompt").is_displayed())
        until(browser, "the node states", lambda b: "healthy" in text_of(b, "#state-counts"))
    finally:
        browser.delete_all_cookies()
        page.terminate()
        page.wait(30)
        log.close()
