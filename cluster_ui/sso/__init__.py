"""Single sign-on: OpenID Connect login and the IdP-groups -> tenants/roles mapping (README "Single sign-on")."""
