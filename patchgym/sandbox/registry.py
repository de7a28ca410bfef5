"""Where an image comes from: its registry and repository, the mirror that replaces its prefix, the login for its
registry, and the compressed size of its layers as the registry's v2 API reports them."""

import ipaddress
import re
from dataclasses import dataclass

from patchgym.sandbox.errors import SandboxError

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
LOCAL_NAMESPACE = "patchgym/"  # recipe images are built here and live in no registry: never mirrored
MANIFEST_TYPES = ", ".join([
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
])


_BUILT_HERE = "an image made here must be built first (`patchgym image build` builds the base image)"
FIXES = {
    "unauthorized": "give its login in sandbox.registry_auth or run `docker login {registry}`",
    "not found": "check the name and tag; " + _BUILT_HERE,
    "unreachable": "check the network, or pull through a mirror (sandbox.image_mirror); " + _BUILT_HERE,
    "unknown host": "no name server knows the registry: check the network, or pull through a mirror "
                    "(sandbox.image_mirror); " + _BUILT_HERE,
}


class ImagePullError(SandboxError):
    """An image that could not be had from its registry; `reason` is unauthorized, not found, unknown host,
    unreachable or failed."""

    def __init__(self, image: str, registry: str, reason: str, detail: str):
        fix = FIXES.get(reason, "").format(registry=registry)
        super().__init__(f"cannot pull image {image!r} from registry {registry}: {reason} ({detail})"
                         + (f"; {fix}" if fix else ""))
        self.image, self.registry, self.reason, self.detail = image, registry, reason, detail


@dataclass(frozen=True)
class ImageRef:
    registry: str  # "docker.io", "127.0.0.1:5000"
    repository: str  # "library/python", "swebench/sweb.eval.x86_64.django_1776_django-11099"
    reference: str  # a tag, or a digest "sha256:..."

    @property
    def pull_name(self) -> str:
        """The name as the engine writes it, without a tag: `docker.io/` left out, as `docker pull` does."""
        if self.registry == DOCKER_HUB:
            return self.repository.removeprefix("library/")
        return f"{self.registry}/{self.repository}"

    def __str__(self) -> str:
        sep = "@" if self.reference.startswith("sha256:") else ":"
        return f"{self.pull_name}{sep}{self.reference}"


def parse_ref(name: str) -> ImageRef:
    """Split an image name as Docker does: the first part is a registry when it has a '.', a ':' or is localhost."""
    rest, digest = name.split("@", 1) if "@" in name else (name, "")
    first, slash, path = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, rest = first, path
    else:
        registry = DOCKER_HUB
    repository, _, tag = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if registry == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    if not re.fullmatch(r"[a-z0-9]+([._/-]+[a-z0-9]+)*", repository):
        raise SandboxError(f"{name!r} is not a valid image name (repository {repository!r})")
    return ImageRef(registry, repository, digest or tag or "latest")


def mirrored(image, mirrors: dict[str, str]):
    """`image` with the longest matching prefix of `mirrors` replaced. Both are read in full form: `python:3.11` is
    `docker.io/library/python:3.11`, and a prefix without a registry host (`swebench/`) means Docker Hub's. Recipes,
    patchgym/ names and `docker save` tars are left as they are."""
    if not isinstance(image, str) or not mirrors or image.startswith(LOCAL_NAMESPACE) or image.endswith(".tar"):
        return image
    ref = parse_ref(image)
    sep = "@" if ref.reference.startswith("sha256:") else ":"
    full = f"{ref.registry}/{ref.repository}{sep}{ref.reference}"
    matches = [(_qualified(prefix), prefix) for prefix in mirrors if full.startswith(_qualified(prefix))]
    if not matches:
        return image
    qualified, prefix = max(matches, key=lambda match: len(match[0]))
    return mirrors[prefix] + full[len(qualified):]


def _qualified(prefix: str) -> str:
    first, slash, _ = prefix.partition("/")
    has_host = slash and ("." in first or ":" in first or first == "localhost")
    return prefix if has_host else f"{DOCKER_HUB}/{prefix}"


def registry_login(registry: str, auth) -> dict | None:
    """The credentials for `registry`: from `sandbox.registry_auth` (a {host: login} map, or the path of a Docker
    config file), else from the user's Docker config (~/.docker/config.json or $DOCKER_CONFIG, credential helpers
    included, as `docker pull` reads it). None: pull anonymously."""
    import docker.auth

    if isinstance(auth, dict):
        login = auth.get(registry)
        if login is not None:
            return {"username": login.username, "password": login.password.get_secret_value()}
        auth = None
    found = docker.auth.load_config(config_path=auth).resolve_authconfig(registry)
    if not found:
        return None
    keys = {"username": "username", "password": "password", "identitytoken": "identitytoken",
            "IdentityToken": "identitytoken", "Username": "username", "Password": "password"}
    return {keys[k]: v for k, v in found.items() if k in keys and v}


def insecure(registry: str, client=None) -> bool:
    """Whether the engine speaks plain HTTP to `registry`: its insecure CIDRs (127.0.0.0/8 by default), its
    insecure registries, or localhost."""
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    if host == "localhost":
        return True
    config = (client.info().get("RegistryConfig") or {}) if client is not None else {}
    index = (config.get("IndexConfigs") or {}).get(registry)
    if index is not None:
        return not index.get("Secure", True)
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    cidrs = config.get("InsecureRegistryCIDRs") or ["127.0.0.0/8"]
    return any(address in ipaddress.ip_network(cidr) for cidr in cidrs)


def compressed_size(image: str, login: dict | None, *, client=None, arch: str = "amd64", timeout: float = 30) -> int:
    """The bytes a pull downloads for `image`: its config and compressed layers, from the registry's manifest (the
    platform's manifest when the tag names a list)."""
    import requests

    ref = parse_ref(image)
    host = DOCKER_HUB_API if ref.registry == DOCKER_HUB else ref.registry
    base = f"{'http' if insecure(ref.registry, client) else 'https'}://{host}/v2/{ref.repository}"
    session = requests.Session()
    session.headers["Accept"] = MANIFEST_TYPES

    def get(url: str):
        try:
            response = session.get(url, timeout=timeout)
            if response.status_code == 401:
                _authorize(session, response, ref, login, timeout)
                response = session.get(url, timeout=timeout)
        except requests.RequestException as exc:
            raise ImagePullError(image, ref.registry, "unreachable", str(exc)) from exc
        if response.status_code in (401, 403):
            raise ImagePullError(image, ref.registry, "unauthorized", f"HTTP {response.status_code} from {url}")
        if response.status_code == 404:
            raise ImagePullError(image, ref.registry, "not found", f"HTTP 404 from {url}")
        if not response.ok:
            raise ImagePullError(image, ref.registry, "failed", f"HTTP {response.status_code} from {url}")
        return response.json()

    manifest = get(f"{base}/manifests/{ref.reference}")
    if "manifests" in manifest:  # a list or index: the entry for this platform
        entries = [m for m in manifest["manifests"]
                   if m.get("platform", {}).get("os") == "linux" and m["platform"].get("architecture") == arch]
        if not entries:
            raise ImagePullError(image, ref.registry, "not found", f"no linux/{arch} image in its manifest list")
        manifest = get(f"{base}/manifests/{entries[0]['digest']}")
    return manifest["config"]["size"] + sum(layer["size"] for layer in manifest["layers"])


def _authorize(session, challenge, ref: ImageRef, login: dict | None, timeout: float) -> None:
    """Answer a 401: basic auth with the login, or a bearer token from the realm the registry names."""
    header = challenge.headers.get("WWW-Authenticate", "")
    scheme, _, params = header.partition(" ")
    basic = (login["username"], login["password"]) if login and "password" in login else None
    if scheme.lower() == "basic":
        session.auth = basic
        return
    fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
    query = {"service": fields.get("service", ""), "scope": fields.get("scope", f"repository:{ref.repository}:pull")}
    token = session.get(fields["realm"], params=query, auth=basic, timeout=timeout)
    if token.ok:
        body = token.json()
        session.headers["Authorization"] = f"Bearer {body.get('token') or body.get('access_token')}"
