"""``POST /api/v1/code/``: upload a code archive for jobs to start in (``colony submit`` packs the
current directory and sends it here before it submits)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiTypes, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from cluster_ui.api.errors import PayloadTooLarge
from cluster_ui.api.throttles import SubmissionRateThrottle
from jobs.services import code
from jobs.services.submission import tenants_of


class CodeArchiveSerializer(serializers.Serializer):
    sha256 = serializers.CharField(help_text="Name it as `code` when submitting a job.")
    size = serializers.IntegerField(help_text="Bytes of the compressed archive.")
    files = serializers.IntegerField()
    unpacked_size = serializers.IntegerField()


class CodeUploadView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(
        request={"application/gzip": OpenApiTypes.BINARY},
        parameters=[OpenApiParameter("tenant", str, description="tenant the code belongs to; optional when you "
                                                                "belong to exactly one")],
        responses={201: CodeArchiveSerializer, 200: CodeArchiveSerializer},
        description="A gzipped tar of regular files and directories with relative names, at most "
                    f"{code.MAX_BYTES >> 20} MiB compressed, {code.MAX_FILES} entries and "
                    f"{code.MAX_UNPACKED_BYTES >> 20} MiB unpacked. Jobs of the tenant may name it by its sha256; "
                    "the same content is stored once.",
    )
    def post(self, request):
        # An upload costs like a submission: it draws on the same per-user budget.
        throttle = SubmissionRateThrottle()
        if not throttle.allow_submission(request):
            raise throttle.refusal()
        tenant = self._tenant(request)
        data = self._body(request)
        try:
            archive, created = code.store(tenant, request.user, data)
        except code.OverQuota as exc:
            raise PayloadTooLarge(str(exc)) from None
        except code.BadArchive as exc:
            raise ValidationError({"archive": [str(exc)]}) from None
        body = CodeArchiveSerializer({"sha256": archive.sha256, "size": archive.size, "files": archive.files,
                                      "unpacked_size": archive.unpacked_size}).data
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @staticmethod
    def _tenant(request):
        mine = tenants_of(request.user)
        slug = request.query_params.get("tenant")
        if slug:
            tenant = mine.filter(slug=slug).first()
            if tenant is None:
                raise ValidationError({"tenant": [f"Unknown tenant '{slug}', or you are not a member of it."]})
            return tenant
        first_two = list(mine[:2])
        if len(first_two) != 1:
            raise ValidationError({"tenant": ["Say which tenant (?tenant=slug)." if first_two
                                              else "You are not a member of any tenant."]})
        return first_two[0]

    @staticmethod
    def _body(request) -> bytes:
        """The raw body, read with its own bound: the API's request limit is for JSON, far below
        an archive's, and Django's ``request.body`` would enforce that one."""
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise ParseError("Bad Content-Length.") from None
        if declared > code.MAX_BYTES:
            raise PayloadTooLarge(f"The archive has {declared} bytes; the most is {code.MAX_BYTES >> 20} MiB.")
        data = request._request.read(code.MAX_BYTES + 1)
        if len(data) > code.MAX_BYTES:
            raise PayloadTooLarge(f"The archive is larger than {code.MAX_BYTES >> 20} MiB.")
        return data
