// Command fraudmesh-score scores one payment transaction through the fraudmesh edge
// (Envoy in front of the gateway) and prints the decision.
//
// Exit status: 0 when the call succeeds, 1 when it fails (the gRPC code and message go to
// stderr, with the field violations of an INVALID_ARGUMENT answer), 2 on bad flags.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	fraudv1 "github.com/fraudmesh/fraudmesh/gen/go/fraud/v1"
)

const (
	exitOK       = 0
	exitRPCError = 1
	exitUsage    = 2

	// maxIDLength matches the gateway's limit on transaction, card, merchant and terminal ids.
	maxIDLength = 128

	// tokenEnv names the environment variable read for the bearer token when -token-file
	// is not given: a token on the command line would be visible to every user of the host.
	tokenEnv = "FRAUDMESH_TOKEN"

	// serviceConfig is the retry policy every client of the edge should use
	// (docs/reliability.md): a call that fails with UNAVAILABLE (the Envoy holding the
	// connection died, or no gateway could take it) is sent again, at most twice more,
	// within the call's own deadline; never DEADLINE_EXCEEDED (late) or RESOURCE_EXHAUSTED
	// (shed: back off). waitForReady lets a call made while the connection is re-established
	// wait for it instead of failing at once. Retries stop while most recent calls fail.
	serviceConfig = `{
  "methodConfig": [{
    "name": [{"service": "fraud.v1.FraudScoring"}, {"service": "fraud.v1.OutcomeService"}],
    "waitForReady": true,
    "retryPolicy": {
      "maxAttempts": 3,
      "initialBackoff": "0.002s",
      "maxBackoff": "0.010s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }],
  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
}`
)

// channels maps the -channel flag values to the proto enum.
var channels = map[string]fraudv1.Channel{
	"card-present":     fraudv1.Channel_CHANNEL_CARD_PRESENT,
	"card-not-present": fraudv1.Channel_CHANNEL_CARD_NOT_PRESENT,
}

// reportedError is a flag error the flag package has already printed, with the usage.
type reportedError struct{ error }

// options are the parsed command-line flags.
type options struct {
	addr           string
	timeout        time.Duration
	connectTimeout time.Duration
	transactionID  string
	cardID         string
	merchantID     string
	terminalID     string
	amountMinor    int64
	amountGiven    bool
	currency       string
	channel        string
	timestamp      string
	json           bool
	tls            bool
	caFile         string
	certFile       string
	keyFile        string
	serverName     string
	tokenFile      string
}

// parseFlags parses args (without the program name); usage and flag errors go to stderr.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("fraudmesh-score", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: fraudmesh-score -card-id ID -merchant-id ID -amount-minor N [flags]\n\n"+
			"Scores one transaction through the fraudmesh edge and prints the decision.\n\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "edge (Envoy) address, host:port")
	fs.DurationVar(&o.timeout, "timeout", 42*time.Millisecond, "deadline of the Score call (sent as grpc-timeout)")
	fs.DurationVar(&o.connectTimeout, "connect-timeout", time.Second, "time allowed to connect, before the call's deadline starts")
	fs.StringVar(&o.transactionID, "transaction-id", "", "caller's id for the transaction (default: a random cli-… id)")
	fs.StringVar(&o.cardID, "card-id", "", "card (PAN token) that pays (required)")
	fs.StringVar(&o.merchantID, "merchant-id", "", "merchant that is paid (required)")
	fs.StringVar(&o.terminalID, "terminal-id", "", "merchant terminal that took the payment (optional)")
	fs.Int64Var(&o.amountMinor, "amount-minor", 0, "amount in minor units of the currency, e.g. cents (required, >= 0; 0 is an account verification)")
	fs.StringVar(&o.currency, "currency", "EUR", "ISO 4217 alphabetic currency code")
	fs.StringVar(&o.channel, "channel", "", "card-present or card-not-present (default: unspecified, scored as card present)")
	fs.StringVar(&o.timestamp, "time", "", "when the transaction happened, RFC 3339 (default: now)")
	fs.BoolVar(&o.json, "json", false, "print the response as one line of protojson")
	fs.BoolVar(&o.tls, "tls", false, "connect over TLS (implied by -ca and -cert)")
	fs.StringVar(&o.caFile, "ca", "", "CA bundle (PEM) that signed the edge's certificate (default: the system's roots)")
	fs.StringVar(&o.certFile, "cert", "", "client certificate (PEM) for mutual TLS")
	fs.StringVar(&o.keyFile, "key", "", "private key (PEM) of -cert")
	fs.StringVar(&o.serverName, "server-name", "", "name to verify the edge's certificate against (default: the -addr host)")
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding a bearer token (default: $"+tokenEnv+")")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, reportedError{err}
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	// 0 is a valid amount, so only whether the flag was given tells that it is missing.
	fs.Visit(func(f *flag.Flag) { o.amountGiven = o.amountGiven || f.Name == "amount-minor" })
	return o, o.check()
}

// check rejects flag values that cannot make a valid request; the gateway validates the rest.
func (o options) check() error {
	var problems []string
	if o.addr == "" {
		problems = append(problems, "-addr must not be empty")
	}
	if o.timeout <= 0 {
		problems = append(problems, "-timeout must be positive")
	}
	if o.connectTimeout <= 0 {
		problems = append(problems, "-connect-timeout must be positive")
	}
	for _, id := range []struct{ flag, value string }{
		{"-card-id", o.cardID},
		{"-merchant-id", o.merchantID},
	} {
		if id.value == "" {
			problems = append(problems, id.flag+" is required")
		}
	}
	for _, id := range []struct{ flag, value string }{
		{"-transaction-id", o.transactionID},
		{"-card-id", o.cardID},
		{"-merchant-id", o.merchantID},
		{"-terminal-id", o.terminalID},
	} {
		if len(id.value) > maxIDLength {
			problems = append(problems, fmt.Sprintf("%s is longer than %d characters", id.flag, maxIDLength))
		}
	}
	if !o.amountGiven {
		problems = append(problems, "-amount-minor is required")
	} else if o.amountMinor < 0 {
		problems = append(problems, "-amount-minor must not be negative")
	}
	if !isCurrencyCode(o.currency) {
		problems = append(problems, fmt.Sprintf("-currency %q is not a three-letter ISO 4217 code", o.currency))
	}
	if _, ok := channels[o.channel]; o.channel != "" && !ok {
		problems = append(problems, fmt.Sprintf("-channel %q is not card-present or card-not-present", o.channel))
	}
	if o.timestamp != "" {
		if _, err := time.Parse(time.RFC3339Nano, o.timestamp); err != nil {
			problems = append(problems, fmt.Sprintf("-time %q is not an RFC 3339 time", o.timestamp))
		}
	}
	if (o.certFile == "") != (o.keyFile == "") {
		problems = append(problems, "-cert and -key go together")
	}
	if o.serverName != "" && !o.useTLS() {
		problems = append(problems, "-server-name needs -tls")
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// isCurrencyCode reports whether s has the shape of an ISO 4217 alphabetic code.
func isCurrencyCode(s string) bool {
	if len(s) != 3 {
		return false
	}
	for _, r := range s {
		if r < 'A' || r > 'Z' {
			return false
		}
	}
	return true
}

// request builds the ScoreRequest; now is the transaction time unless -time was given.
// It assumes check passed.
func (o options) request(now time.Time) *fraudv1.ScoreRequest {
	when := now
	if o.timestamp != "" {
		when, _ = time.Parse(time.RFC3339Nano, o.timestamp)
	}
	id := o.transactionID
	if id == "" {
		id = "cli-" + rand.Text()
	}
	return &fraudv1.ScoreRequest{
		TransactionId: id,
		CardId:        o.cardID,
		MerchantId:    o.merchantID,
		TerminalId:    o.terminalID,
		AmountMinor:   o.amountMinor,
		Currency:      o.currency,
		Timestamp:     timestamppb.New(when),
		Channel:       channels[o.channel],
	}
}

// useTLS reports whether the connection is to use TLS.
func (o options) useTLS() bool {
	return o.tls || o.caFile != "" || o.certFile != ""
}

// transportCredentials builds TLS credentials (TLS 1.2 at least, with the -ca roots and
// the -cert client certificate when given), or plaintext ones without TLS.
func (o options) transportCredentials() (credentials.TransportCredentials, error) {
	if !o.useTLS() {
		return insecure.NewCredentials(), nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.serverName}
	if o.caFile != "" {
		pem, err := os.ReadFile(o.caFile)
		if err != nil {
			return nil, fmt.Errorf("-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-ca: no PEM certificate in %s", o.caFile)
		}
		cfg.RootCAs = pool
	}
	if o.certFile != "" {
		pair, err := tls.LoadX509KeyPair(o.certFile, o.keyFile)
		if err != nil {
			return nil, fmt.Errorf("-cert/-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(cfg), nil
}

// token returns the bearer token from -token-file, else from $FRAUDMESH_TOKEN, else "".
func (o options) token(getenv func(string) string) (string, error) {
	if o.tokenFile == "" {
		return strings.TrimSpace(getenv(tokenEnv)), nil
	}
	raw, err := os.ReadFile(o.tokenFile)
	if err != nil {
		return "", fmt.Errorf("-token-file: %w", err)
	}
	token := strings.TrimSpace(string(raw))
	if token == "" {
		return "", fmt.Errorf("-token-file: %s is empty", o.tokenFile)
	}
	return token, nil
}

// connect dials addr and waits until the connection is ready, so that connection set-up
// does not count against the call's deadline (a payment system keeps its channels warm).
func connect(ctx context.Context, addr string, timeout time.Duration, creds credentials.TransportCredentials) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), grpc.WithDefaultServiceConfig(serviceConfig))
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "cannot use address %q: %v", addr, err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn.Connect()
	for {
		state := conn.GetState()
		if state == connectivity.Ready {
			return conn, nil
		}
		if !conn.WaitForStateChange(ctx, state) {
			conn.Close()
			return nil, status.Errorf(codes.Unavailable, "cannot connect to %s within %v (last state %v)", addr, timeout, state)
		}
	}
}

// printSummary writes the response as aligned, human-readable lines.
func printSummary(w io.Writer, resp *fraudv1.ScoreResponse, roundTrip time.Duration) {
	reasons := "-"
	if len(resp.GetReasons()) > 0 {
		reasons = strings.Join(resp.GetReasons(), "; ")
	}
	fmt.Fprintf(w, "transaction  %s\n", resp.GetTransactionId())
	fmt.Fprintf(w, "decision     %s\n", strings.TrimPrefix(resp.GetDecision().String(), "DECISION_"))
	fmt.Fprintf(w, "score        %.4f\n", resp.GetScore())
	fmt.Fprintf(w, "reasons      %s\n", reasons)
	fmt.Fprintf(w, "model        %s\n", resp.GetModelVersion())
	fmt.Fprintf(w, "scored by    %s\n", enumWord(resp.GetScoredBy().String(), "SCORED_BY_"))
	fmt.Fprintf(w, "features     %s\n", enumWord(resp.GetFeatureSource().String(), "FEATURE_SOURCE_"))
	fmt.Fprintf(w, "elapsed      %.2f ms in the gateway, %.2f ms round trip\n",
		resp.GetElapsedMs(), float64(roundTrip.Microseconds())/1000)
}

// oneLineJSON renders msg as protojson (every field, even when zero) on one compact line;
// protojson itself varies its whitespace on purpose.
func oneLineJSON(msg proto.Message) ([]byte, error) {
	raw, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(msg)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Compact(&out, raw); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// enumWord turns an enum value name such as SCORED_BY_MODEL into "model".
func enumWord(name, prefix string) string {
	return strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, prefix), "_", " "))
}

// printError writes a failed call's canonical code, message and any details it carries.
func printError(w io.Writer, err error) {
	st := status.Convert(err)
	fmt.Fprintf(w, "fraudmesh-score: %s: %s\n", code.Code(st.Code()).String(), st.Message())
	for _, detail := range st.Details() {
		switch d := detail.(type) {
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				fmt.Fprintf(w, "  field %s: %s\n", v.GetField(), v.GetDescription())
			}
		case proto.Message:
			fmt.Fprintf(w, "  %s: %s\n", d.ProtoReflect().Descriptor().FullName(),
				prototext.MarshalOptions{}.Format(d))
		case error:
			fmt.Fprintf(w, "  undecodable detail: %v\n", d)
		}
	}
}

// pushbackHeader is the trailer in which a server that refuses a call (RESOURCE_EXHAUSTED)
// says how many milliseconds to wait before sending again (gRFC A6).
const pushbackHeader = "grpc-retry-pushback-ms"

// scoreHonouringPushback sends req; when the edge refuses it at its limit and says when to
// come back, it waits that long and sends it once more, if the call's deadline leaves time
// for both. A refusal without a pushback, or one that does not fit, is returned at once: the
// payment system then answers by its own fallback instead of waiting past its budget.
func scoreHonouringPushback(ctx context.Context, client fraudv1.FraudScoringClient, req *fraudv1.ScoreRequest, stderr io.Writer) (*fraudv1.ScoreResponse, error) {
	var trailer metadata.MD
	resp, err := client.Score(ctx, req, grpc.Trailer(&trailer))
	wait, ok := pushback(err, trailer)
	if !ok {
		return resp, err
	}
	if deadline, has := ctx.Deadline(); has && time.Until(deadline) <= wait {
		fmt.Fprintf(stderr, "fraudmesh-score: the edge asks to retry after %v, past the call's deadline\n", wait)
		return resp, err
	}
	fmt.Fprintf(stderr, "fraudmesh-score: refused at the edge's limit; retrying once after %v\n", wait)
	select {
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-time.After(wait):
	}
	return client.Score(ctx, req)
}

// pushback is how long a RESOURCE_EXHAUSTED refusal asks the client to wait, when it says.
func pushback(err error, trailer metadata.MD) (time.Duration, bool) {
	if status.Code(err) != codes.ResourceExhausted {
		return 0, false
	}
	values := trailer.Get(pushbackHeader)
	if len(values) != 1 {
		return 0, false
	}
	ms, convErr := strconv.Atoi(values[0])
	if convErr != nil || ms < 0 {
		// A malformed or negative pushback means "do not retry" (gRFC A6).
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// run is the whole command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, err := parseFlags(args, stderr)
	var reported reportedError
	switch {
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &reported):
		return exitUsage
	case err != nil:
		fmt.Fprintf(stderr, "fraudmesh-score: %v (see -h)\n", err)
		return exitUsage
	}

	creds, err := opts.transportCredentials()
	if err != nil {
		fmt.Fprintf(stderr, "fraudmesh-score: %v\n", err)
		return exitUsage
	}
	token, err := opts.token(os.Getenv)
	if err != nil {
		fmt.Fprintf(stderr, "fraudmesh-score: %v\n", err)
		return exitUsage
	}
	if token != "" && !opts.useTLS() {
		fmt.Fprintf(stderr, "fraudmesh-score: warning: sending the bearer token without TLS\n")
	}

	conn, err := connect(ctx, opts.addr, opts.connectTimeout, creds)
	if err != nil {
		printError(stderr, err)
		return exitRPCError
	}
	defer conn.Close()

	req := opts.request(time.Now())
	ctx, cancel := context.WithTimeout(ctx, opts.timeout)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	start := time.Now()
	resp, err := scoreHonouringPushback(ctx, fraudv1.NewFraudScoringClient(conn), req, stderr)
	roundTrip := time.Since(start)
	if err != nil {
		printError(stderr, err)
		return exitRPCError
	}

	if opts.json {
		out, err := oneLineJSON(resp)
		if err != nil {
			fmt.Fprintf(stderr, "fraudmesh-score: cannot encode the response: %v\n", err)
			return exitRPCError
		}
		fmt.Fprintf(stdout, "%s\n", out)
		return exitOK
	}
	printSummary(stdout, resp, roundTrip)
	return exitOK
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	exit := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(exit)
}
