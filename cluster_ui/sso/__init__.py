"""Single sign-on: OpenID Connect login and the IdP-groups -> tenants/roles mapping
(docs/operations.md "Single sign-on")."""
