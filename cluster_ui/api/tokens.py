"""API tokens through the API: trade a password for one (``colony login``), list yours, make one,
revoke one (yours; an operator, anyone's). What a token is and how it is checked:
:mod:`cluster_ui.api_tokens`."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import permissions, serializers, status
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from cluster_ui import api_tokens
from cluster_ui.models import ApiToken


class ApiTokenSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)
    active = serializers.BooleanField(read_only=True)
    revoked_by = serializers.CharField(source="revoked_by.username", read_only=True, default=None, allow_null=True)

    class Meta:
        model = ApiToken
        fields = ["id", "user", "name", "ending", "created_at", "expires_at", "last_used_at", "revoked_at",
                  "revoked_by", "active"]


class CreatedTokenSerializer(ApiTokenSerializer):
    """A token just made: the only answer that carries its key (``token``: the same, for ``colony login``)."""

    key = serializers.CharField(read_only=True)
    token = serializers.CharField(read_only=True)

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "key", "token"]


class NewTokenSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    expires_in_days = serializers.IntegerField(required=False, min_value=1, default=None, allow_null=True)

    def validate_expires_in_days(self, days):
        if days is not None and days > api_tokens.max_days():
            raise serializers.ValidationError(f"At most {api_tokens.max_days()} days (COLONY_API_TOKEN_MAX_DAYS).")
        return days


def _created(token: ApiToken, key: str, code: int = status.HTTP_201_CREATED) -> Response:
    return Response({**ApiTokenSerializer(token).data, "key": key, "token": key}, status=code)


class ObtainTokenView(APIView):
    """Username and password in, a new API token out (valid COLONY_API_TOKEN_DAYS days)."""

    authentication_classes = []
    permission_classes = [permissions.AllowAny]
    parser_classes = api_settings.DEFAULT_PARSER_CLASSES
    serializer_class = AuthTokenSerializer

    @extend_schema(request=AuthTokenSerializer, responses={200: CreatedTokenSerializer})
    def post(self, request):
        serializer = AuthTokenSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        token, key = api_tokens.issue(serializer.validated_data["user"], name="colony login")
        return _created(token, key, status.HTTP_200_OK)  # (200, as the exchange always answered)


class TokenListView(APIView):
    """Your API tokens (an operator: ``?all=1`` for everyone's), newest first; POST makes one
    (``name``, ``expires_in_days``): its key is in the answer, and only there."""

    serializer_class = ApiTokenSerializer

    @extend_schema(responses=ApiTokenSerializer(many=True),
                   parameters=[OpenApiParameter("all", bool, description="Everyone's (operators only).")])
    def get(self, request):
        tokens = ApiToken.objects.select_related("user", "revoked_by")
        if not (request.query_params.get("all") and api_tokens.is_operator(request.user)):
            tokens = tokens.filter(user=request.user)
        return Response(ApiTokenSerializer(tokens, many=True).data)

    @extend_schema(request=NewTokenSerializer, responses={201: CreatedTokenSerializer})
    def post(self, request):
        asked = NewTokenSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        token, key = api_tokens.issue(request.user, asked.validated_data["name"],
                                      asked.validated_data["expires_in_days"])
        return _created(token, key)


class TokenDetailView(APIView):
    """One token; DELETE revokes it at once (yours, or anyone's for an operator)."""

    serializer_class = ApiTokenSerializer

    def _token(self, request, pk) -> ApiToken:
        token = get_object_or_404(ApiToken.objects.select_related("user"), pk=pk)
        if not api_tokens.may_manage(request.user, token):
            raise api_tokens_not_found()
        return token

    @extend_schema(responses=ApiTokenSerializer)
    def get(self, request, pk):
        return Response(ApiTokenSerializer(self._token(request, pk)).data)

    @extend_schema(responses=ApiTokenSerializer)
    def delete(self, request, pk):
        token = self._token(request, pk)
        api_tokens.revoke(token, request.user)
        return Response(ApiTokenSerializer(token).data)


def api_tokens_not_found():
    from django.http import Http404

    return Http404("No such token.")  # another user's token: not said to exist
